"""`python -m bench method=<m> task=<t> model=<model> [overrides]`: run one benchmark (Hydra app)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from bench.errors import MissingArtifactError
from bench.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from bench.engine.kvcache import UnsupportedModelError
    from bench.measure.run import run

    try:
        with sweep_claim(cfg):
            run(cfg)
    except (MissingArtifactError, ConfigError, UnsupportedModelError) as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


def sweep_claim(cfg: DictConfig):
    """A CPU job of a multirun claims its torch threads among its sweep's jobs (bench.measure.core_claims); other
    runs (single runs, GPU jobs, server backends, whose engine is timed elsewhere) claim nothing."""
    from contextlib import nullcontext

    import torch
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from bench.measure.contention import available_cores
    from bench.measure.core_claims import claim_cores
    from bench.models import resolve_device

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or cfg.get("backend", "engine") != "engine" or \
            resolve_device(str(cfg.get("device", "auto"))).type != "cpu":
        return nullcontext()
    return claim_cores(Path(hydra_cfg.sweep.dir) / ".core_claims", torch.get_num_threads(), available_cores())


if __name__ == "__main__":
    main()
