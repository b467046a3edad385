"""Medusa's heads: K residual blocks over the target's last hidden state, with private projections or a shared one."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary, ResBlock


class MedusaHeads(nn.Module):
    """K Medusa heads. `private_vocab_size` gives each head its own projection (upstream layout); else the heads
    return hidden states and the caller projects them through a shared DraftVocabulary."""

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1, private_vocab_size: int | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))
                                    for _ in range(num_heads))
        self.projections = None if private_vocab_size is None else nn.ModuleList(
            nn.Linear(hidden_size, private_vocab_size, bias=False) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def logits(self, hidden: torch.Tensor, vocab: DraftVocabulary, head: int) -> torch.Tensor:
        """[..., H] target features -> [..., V'] logits of one head."""
        out = self.blocks[head](hidden)
        return vocab(out) if self.projections is None else self.projections[head](out)
