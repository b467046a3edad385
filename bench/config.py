"""The run's configuration: conf/config.yaml composed with overrides, as `python -m bench ...` composes it."""
from __future__ import annotations

import sys

from omegaconf import DictConfig

from bench import DEPRECATED_SIZING, SIZINGS, deprecated_meaning, sizing_of
from bench.artifacts import PROJECT_ROOT


def compose_config(*overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with Hydra `overrides`, as `python -m bench ...` composes it, without running anything."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)
    return fold_deprecated(cfg)


def fold_deprecated(cfg: DictConfig) -> DictConfig:
    """`cfg` with `method.budget` and `method.batch_policy` (method.sizing's old names) folded into method.sizing
    and set to null, one stderr line for each that was set. Left for bench.validate to name: values they do not
    accept, a bad method.sizing, and a method without sizing (vanilla)."""
    method = cfg.get("method")
    if method is None or method.get("sizing") not in SIZINGS:
        return cfg
    given = {key: method.get(key) for key in DEPRECATED_SIZING if deprecated_meaning(method, key) is not None}
    if not given:
        return cfg
    method.sizing = sizing_of(method)
    for key, value in given.items():
        print(f"warning: method.{key}={value} is deprecated: use method.sizing={deprecated_meaning(method, key)}",
              file=sys.stderr)
        method[key] = None
    return cfg
