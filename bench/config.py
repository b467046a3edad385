"""The run's configuration: conf/config.yaml composed with overrides, as `python -m bench ...` composes it."""
from __future__ import annotations

from omegaconf import DictConfig

from bench.artifacts import PROJECT_ROOT


def compose_config(*overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with Hydra `overrides`, as `python -m bench ...` composes it, without running anything."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)
