"""`python -m bench method=<m> task=<t> model=<model> [overrides]`: run one benchmark (Hydra app over
conf/config.yaml; `specbench` is the same command)."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from bench.config import fold_deprecated, run_hydra_command
from bench.errors import exit_on_user_error
from bench.settings import RunSettings


def main() -> None:
    run_hydra_command(benchmark, "config")


def benchmark(cfg: DictConfig) -> None:
    """One run of the composed `cfg`: its settings checked (one `error:` line per bad value, exit status 2) before
    anything loads."""
    import torch
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from bench.engine.kvcache import UnsupportedModelError
    from bench.measure.own_process import RunFailed, own_process_needed, run_in_own_process
    from bench.measure.run import run
    from bench.records import FolderInUseError
    from bench.settings import compile_choice
    from bench.validate import validate

    hydra_cfg = HydraConfig.get()
    with exit_on_user_error(UnsupportedModelError, FolderInUseError):
        settings = validate(fold_deprecated(cfg))
        with sweep_claim(settings):
            if not own_process_needed(hydra_cfg.mode == RunMode.MULTIRUN, hydra_cfg.runtime.choices["hydra/launcher"],
                                      settings.backend == "engine" and compile_choice(cfg)[0]):
                run(cfg, settings)
                return
            print("engine.compile: a compiled job of this sweep runs in a process of its own (its graphs would stay "
                  "in the sweep's: bench/measure/own_process.py)", file=sys.stderr)
            try:
                run_in_own_process(cfg, torch.get_num_threads())
            except RunFailed as failed:
                sys.exit(failed.code)


def sweep_claim(settings: RunSettings):
    """A CPU job of a multirun claims its torch threads among its sweep's jobs (bench.measure.core_claims; a SLURM job's
    threads are the cores it was allotted, claimed among its node's jobs: bench.measure.scheduler); other
    runs (single runs, GPU jobs, server backends, whose engine is timed elsewhere) claim nothing."""
    from contextlib import nullcontext

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from bench.measure.core_claims import claim_cores
    from bench.measure.scheduler import claim_scope, job_threads, placement
    from bench.models import resolve_device

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or settings.backend != "engine" or \
            resolve_device(settings.device).type != "cpu":
        return nullcontext()
    where = placement()
    folder, cores = claim_scope(Path(hydra_cfg.sweep.dir), where)
    return claim_cores(folder, job_threads(where), cores)


if __name__ == "__main__":
    main()
