"""`python -m bench.train method=<sps|medusa|eagle|eagle3|hydra> [model=<model>] [train.<key>=...]`: train a method's
draft weights (`specbench-train` is the same command).

Hydra app over conf/ (primary config conf/train.yaml, recipe conf/train/<method>.yaml). The trained-head methods
(Medusa, EAGLE, Hydra) share one pipeline, methods/heads/training.py, whose recipe names the method's head and
loss; SpS trains its draft model (methods/sps/train.py); train.backend=modelopt trains Medusa with NVIDIA ModelOpt.
Each run is one stint (docs/training.md): `train.minutes=N` from scratch, `train.resume=true train.minutes=N` on
from the committed weights, `train.minutes=0` to print the committed weights' held-out agreement.
"""
from __future__ import annotations

from omegaconf import DictConfig

from bench.config import fold_deprecated, run_hydra_command
from bench.errors import ConfigError, exit_on_user_error

BACKENDS = ("native", "modelopt")  # train.backend: this project's heads, or NVIDIA ModelOpt's Medusa


def main() -> None:
    run_hydra_command(train, "train", folders={"method": "train"})  # a method without a recipe has nothing to train


def train(cfg: DictConfig) -> None:
    """Train the method of the composed `cfg` with its recipe's trainer (old spellings folded first, then every
    training value checked before the target loads); a setting or an artifact to fix is one `error:` line, exit
    status 2."""
    with exit_on_user_error():
        _dispatch(fold_deprecated(cfg))


def _dispatch(cfg: DictConfig) -> None:
    """The trainer of `cfg.train` handed its typed run (methods/heads/settings.py TrainingRun)."""
    import hydra.utils

    from methods.heads.settings import TrainingRun

    backend = cfg.train.get("backend", "native")
    if backend not in BACKENDS:
        raise ConfigError(f"train.backend={backend}: must be {' or '.join(BACKENDS)}")
    if backend == "modelopt":  # NVIDIA ModelOpt's Medusa (optional extra)
        from methods.medusa.modelopt import modelopt_run, train_modelopt_medusa

        train_modelopt_medusa(modelopt_run(cfg))
    elif cfg.train.get("recipe") is not None:
        from methods.heads.training import train_heads

        train_heads(TrainingRun.from_config(cfg), hydra.utils.instantiate(cfg.train.recipe))
    else:
        from methods.sps.settings import SpsTrainSettings
        from methods.sps.train import train as train_draft

        train_draft(TrainingRun.from_config(cfg, SpsTrainSettings))


if __name__ == "__main__":
    main()
