"""`python -m bench method=<m> task=<t> model=<model> [overrides]`: run one benchmark (Hydra app)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from bench.errors import MissingArtifactError
from bench.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from bench.engine.kvcache import UnsupportedModelError
    from bench.measure.run import run

    try:
        run(cfg)
    except (MissingArtifactError, ConfigError, UnsupportedModelError) as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
