"""The named experiments (conf/experiment/<name>.yaml, `python -m bench +experiment=<name> -m`): sweeps kept as data.
Every job of each experiment's sweep composes and passes the settings check, as the sweep would start it, without
running anything; command-line overrides replace the experiment's values."""
from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from bench.config import CONF_DIR, compose_config
from bench.validate import validate

EXPERIMENTS = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))


def jobs(name: str, *command_line: str) -> list[list[str]]:
    """Each job's overrides as Hydra's basic sweeper makes them from the experiment's hydra.sweeper.params and the
    command line's (which come after, so they win)."""
    params = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml").hydra.sweeper.params
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        [batch] = BasicSweeper.split_arguments(parser.parse_overrides(
            [f"{key}={value}" for key, value in params.items()] + list(command_line)), None)
    return batch


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_job_of_an_experiment_composes_and_passes_the_settings_check(name):
    text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n") and f"python -m bench +experiment={name} -m" in text
    folders = set()
    for job in jobs(name):
        cfg = compose_config(f"+experiment={name}", *job)
        validate(cfg)
        folders.add(cfg.out_dir)
    assert len(folders) == len(jobs(name))  # a folder of its own for every job


def test_the_experiments_sweep_what_their_shell_scripts_did():
    assert len(jobs("batch_sweep")) == 2 * 2 * 4 and len(jobs("cost_model")) == 8 * 2
    shapes = [compose_config("+experiment=eagle2_grid", *job).out_dir for job in jobs("eagle2_grid")]
    assert shapes == [f"results/runs/eagle2_grid/eagle2-{shape}" for shape in
                      ("6-2-2", "8-2-2", "8-3-2", "8-4-2", "12-3-3", "16-4-4")]
    methods = {path.stem for path in (CONF_DIR / "method").glob("*.yaml")} - {"vanilla"}
    temperature = jobs("temperature")
    assert {job[0].removeprefix("method=") for job in temperature} == methods and len(temperature) == len(methods) * 6


def test_command_line_overrides_replace_the_experiments_values():
    greedy = jobs("temperature", "gen.temperature=0", "seed=0", "method=pld,eagle2")
    assert greedy == [["method=pld", "gen.temperature=0", "seed=0"], ["method=eagle2", "gen.temperature=0", "seed=0"]]
    cfg = compose_config("+experiment=temperature", *greedy[0])
    assert cfg.out_dir.startswith("results/runs/temperature/smollm2_135m/pld/all-128tok-") and cfg.task.limit == 5


@pytest.mark.parametrize(("argv", "reordered"), [
    (["+experiment=cost_model", "-m", "method=pld,eagle2"], ["-m", "+experiment=cost_model", "method=pld,eagle2"]),
    (["task=qa", "--cfg", "job", "method=pld"], ["--cfg", "job", "task=qa", "method=pld"]),
    (["-m", "method=pld", "task=qa"], ["-m", "method=pld", "task=qa"]),
])
def test_hydra_s_flags_go_before_every_override(argv, reordered):
    from bench.config import flags_first

    assert flags_first(argv) == reordered


def test_overrides_after_a_flag_are_taken_as_the_experiments_comments_write_them():
    """`python -m bench +experiment=<name> -m method=...`, as conf/experiment/*.yaml's comments say: Hydra's own parser
    refused the overrides after the flag (exit 2, "unrecognized arguments")."""
    import subprocess
    import sys

    from bench.artifacts import PROJECT_ROOT

    done = subprocess.run([sys.executable, "-m", "bench", "+experiment=cost_model", "--cfg", "job", "method=pld",
                           "method.sizing=auto"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = OmegaConf.create(done.stdout)
    assert (shown.method.name, shown.method.sizing, shown.task.limit) == ("pld", "auto", 5)
