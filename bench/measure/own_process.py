"""A compiled run in a process of its own. A compiled graph outlives its run: torch's guards keep the graphs of a run,
and with them its model's weights and every frozen graph's packed copy of them, for as long as the process lives
(measured: about 1.7 GB a float32 run of SmolLM2-135M; torch._dynamo.reset() frees none of it). So a process that
runs compiled runs one after another, a Hydra multirun on the basic or joblib launcher or bench.smoke, runs each in
a Python process of its own, which ends with its run. submitit's jobs are processes of their own already.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench.errors import MissingArtifactError, exit_on_user_error

CHILD = f"import sys; from {__name__} import run_child; run_child(*sys.argv[1:])"  # not a command of its own
MISSING_ARTIFACT = 3  # the child's exit status for a MissingArtifactError, its message in the file it was given


class RunFailed(RuntimeError):
    """The run's process ended with an error (exit status `code`); what it printed is above."""

    def __init__(self, code: int):
        super().__init__(f"the run's own process exited with status {code}; its error is printed above")
        self.code = code


def own_process_needed(multirun: bool, launcher: str, compiled: bool) -> bool:
    """Whether a run of a Hydra command runs in a process of its own: a compiled run of a multirun whose launcher
    runs its jobs in one process after another (basic, joblib's reused workers), not submitit's."""
    return multirun and compiled and not launcher.startswith("submitit")


def run_in_own_process(cfg: DictConfig, threads: int) -> None:
    """bench.measure.run.run(cfg) in a new Python process with `threads` torch threads, its output printed as it
    comes. A missing artifact comes back as MissingArtifactError (its message), any other failure as RunFailed."""
    with tempfile.TemporaryDirectory(prefix="specbench-run-") as folder:
        config, missing = Path(folder) / "config.yaml", Path(folder) / "missing.txt"
        config.write_text(OmegaConf.to_yaml(cfg, resolve=True))
        code = subprocess.run([sys.executable, "-c", CHILD, str(config), str(threads), str(missing)]).returncode
        if code == MISSING_ARTIFACT:
            raise MissingArtifactError(missing.read_text())
        if code:
            raise RunFailed(code)


def run_child(config: str, threads: str, missing: str) -> None:
    """The child's side: run the config file's run with `threads` torch threads."""
    import torch

    from bench.engine.kvcache import UnsupportedModelError
    from bench.measure.run import run
    from bench.records import FolderInUseError

    torch.set_num_threads(int(threads))
    with exit_on_user_error(UnsupportedModelError, FolderInUseError):  # a bad setting: its `error:` lines, status 2
        try:
            run(OmegaConf.load(config))
        except MissingArtifactError as err:  # the caller's to say (bench.smoke skips the method)
            Path(missing).write_text(str(err))
            sys.exit(MISSING_ARTIFACT)
