"""`python -m bench method=<m> task=<t> model=<model> [overrides]`: run one benchmark (Hydra app over
conf/config.yaml; `specbench` is the same command)."""
from __future__ import annotations

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
    from bench.engine.kvcache import UnsupportedModelError
    from bench.measure.run import run
    from bench.records import FolderInUseError
    from bench.validate import validate

    with exit_on_user_error(UnsupportedModelError, FolderInUseError):
        settings = validate(fold_deprecated(cfg))
        with sweep_claim(settings):
            run(cfg, settings)


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
