"""Heads saved by this project's trainer (methods/heads/training.py, `save_heads`), loaded back."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from methods.heads.common import DraftVocabulary, load_strictly, read_heads

VOCABULARY_KEY = "draft_vocab_ids"  # beside the weights: the draft vocabulary's target ids, when it is a slice


def load_saved_heads(folder: Path, method: str, build: Callable[[dict], nn.Module], lm_head: nn.Module,
                     train_command: str) -> tuple[nn.Module, DraftVocabulary]:
    """(module, draft vocabulary over the target's `lm_head`) of `method`'s checkpoint in `folder`: the module
    `build(config.json's fields)`, loaded strictly."""
    config, state = read_heads(folder, method, train_command)
    module = build(config)
    load_strictly(module, {k: v for k, v in state.items() if k != VOCABULARY_KEY}, folder / "model.safetensors",
                  f"remake it with: {train_command}")
    return module, DraftVocabulary(lm_head, state.get(VOCABULARY_KEY))
