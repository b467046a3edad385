"""Random weights for the tiny drafters each trained method offers the tests (`tiny_drafter` beside its drafter)."""
from __future__ import annotations

import torch
from torch import nn


def random_weights(module: nn.Module, seed: int, std: float = 0.3) -> nn.Module:
    """`module` with every parameter N(0, std) from `seed`, in eval mode: on a tiny target, wide enough that the
    drafts get p ~ 0.1-0.3, so that steps both accept and reject."""
    torch.manual_seed(seed)
    for p in module.parameters():
        nn.init.normal_(p, std=std)
    return module.eval()
