"""Hydra's training recipe (methods/heads/training.py): each head teacher-forced on the corpus tokens above it."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary
from methods.hydra.heads import HydraHeads


def hydra_loss(heads: HydraHeads, vocab: DraftVocabulary, embed: nn.Embedding, batch, decay: float = 0.8):
    """Sum over heads of decay^k x cross-entropy against the target's own predictions, teacher-forced on the
    corpus tokens: head k at t reads h_t and e(ids[t+1 .. t+k+1]) and is trained on labels[t+k+1]."""
    hidden, ids, labels, mask = batch.hidden, batch.input_ids, batch.labels, batch.mask
    with torch.no_grad():
        embeds = embed(ids)  # [B, S, H]
    total, outputs = hidden.new_zeros(()), []
    seq = hidden.shape[1]
    for k in range(heads.num_heads):
        span = seq - k - 1  # positions t with t + k + 1 < S
        keep = mask[:, k + 1 :]
        path = torch.stack([embeds[:, 1 + j : 1 + j + span] for j in range(k + 1)], dim=2)  # [B, span, k+1, H]
        logits = heads.logits(hidden[:, :span][keep], path[keep], vocab, k)
        targets = vocab.slice_positions(labels[:, k + 1 :][keep])
        total = total + decay ** k * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


class HydraRecipe:
    """Training recipe for methods/heads/training.py."""

    method = "hydra"

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def build(self, target, tcfg) -> HydraHeads:
        return HydraHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: HydraHeads, vocab: DraftVocabulary, batch, target):
        return hydra_loss(module, vocab, target.get_input_embeddings(), batch, self.decay)

    def checkpoint_config(self, module: HydraHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}
