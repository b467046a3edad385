"""Train a method's draft weights: `python -m bench.train method=<sps|medusa|eagle|hydra> [model=<model>] [train.<key>=...]`

Hydra app over conf/ (primary config conf/train.yaml, recipe conf/train/<method>.yaml). The trained-head methods
(Medusa, EAGLE, Hydra) share one pipeline, methods/heads/training.py, whose recipe names the method's head and
loss; SpS trains its draft model (methods/sps_train.py); train.backend=modelopt trains Medusa with NVIDIA ModelOpt.
Each run is one stint (docs/training.md): `train.minutes=N` from scratch, `train.resume=true train.minutes=N` on
from the committed weights, `train.minutes=0` to print the committed weights' held-out agreement.
"""
from __future__ import annotations

import hydra
import hydra.utils
from omegaconf import DictConfig

from bench.artifacts import PROJECT_ROOT


@hydra.main(config_path=str(PROJECT_ROOT / "conf"), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.train.get("backend", "native") == "modelopt":  # NVIDIA ModelOpt's Medusa (optional extra)
        from methods.heads.modelopt import train_modelopt_medusa

        train_modelopt_medusa(cfg)
    elif cfg.train.get("recipe") is not None:
        from methods.heads.training import train_heads

        train_heads(cfg, hydra.utils.instantiate(cfg.train.recipe))
    else:
        from methods.sps_train import train

        train(cfg)


if __name__ == "__main__":
    main()
