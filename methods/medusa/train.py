"""Medusa's training: the loss sum_k decay^k CE_k (Medusa-1) and the recipe for methods/heads/training.py."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary
from methods.medusa.heads import MedusaHeads


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
    """Training recipe for methods/heads/training.py: `num_heads` heads of `num_layers` ResBlocks, projection shared
    with the target's LM head (or its draft-vocabulary slice), loss sum_k decay^k CE_k (Medusa-1)."""

    method = "medusa"

    def build(self, target, tcfg) -> MedusaHeads:
        return MedusaHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: MedusaHeads, vocab: DraftVocabulary, batch, target):
        return medusa_loss(module, vocab, batch.hidden, batch.labels, batch.mask, self.decay)

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def checkpoint_config(self, module: MedusaHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}
