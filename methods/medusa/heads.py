"""Medusa's heads (K residual blocks over the target's last hidden state), their training loss and recipe."""
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


def medusa_loss(heads: MedusaHeads, vocab: DraftVocabulary, hidden: torch.Tensor, labels: torch.Tensor,
                mask: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum over heads of decay^k x cross-entropy against the target's own predictions.

    hidden [B, S, H] (features at t), labels [B, S] (the target's argmax at t: its next token), mask [B, S].
    Head k at t is trained on labels[t + k + 1]. Returns (loss, per-head logits at the masked positions' labels
    as (logits [N, V'], targets [N]) pairs for metrics).
    """
    total, outputs = hidden.new_zeros(()), []
    for k in range(heads.num_heads):
        shift = k + 1
        keep = mask[:, shift:]
        h = hidden[:, :-shift][keep]  # [N, H]
        targets = vocab.slice_positions(labels[:, shift:][keep])  # [N]
        logits = heads.logits(h, vocab, k)
        total = total + decay ** k * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


class MedusaRecipe:
    """Training recipe for methods/heads/training.py: `num_heads` heads of `num_layers` ResBlocks, projection shared with
    the target's LM head (or its draft-vocabulary slice), loss sum_k decay^k CE_k (Medusa-1)."""

    method = "medusa"

    def build(self, target, tcfg) -> MedusaHeads:
        return MedusaHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: MedusaHeads, vocab: DraftVocabulary, batch, target):
        return medusa_loss(module, vocab, batch.hidden, batch.labels, batch.mask, self.decay)

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def checkpoint_config(self, module: MedusaHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}
