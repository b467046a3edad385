"""DFlash's training recipe (methods/heads/training.py), after the paper's (arXiv 2602.06036, section 4) and
SpecForge's DFlash trainer: random anchors in the answer, one block per anchor seeded with the anchor token and mask
tokens, every block drafted at once under one attention mask, a decaying cross-entropy over the block."""
from __future__ import annotations

import torch
from torch import nn

from methods.dflash.checkpoints import drafter_config, published_config
from methods.dflash.head import DFlashDrafter
from methods.heads.common import DraftVocabulary


def sample_anchors(mask: torch.Tensor, count: int, generator: torch.Generator | None = None):
    """Per sequence, `count` anchor positions a drawn without replacement among those whose next token is trained
    on (mask[a]; a >= 1 so that some context precedes), sorted: ([B, count] int64, [B, count] bool: the anchor is
    real; a sequence with fewer candidates pads with unreal anchors)."""
    valid = mask.clone()
    valid[:, 0] = False
    scores = torch.rand(mask.shape, generator=generator).to(mask.device).masked_fill(~valid, 2.0)
    anchors = scores.topk(min(count, mask.shape[1]), dim=1, largest=False).indices.sort(dim=1).values
    return anchors, valid.gather(1, anchors)


def block_attention_mask(anchors: torch.Tensor, real: torch.Tensor, context: int, block_size: int) -> torch.Tensor:
    """[B, 1, N x block, context + N x block] bool (True: attend): a block's rows see the context before its anchor
    and their own block, bidirectionally; an unreal block sees only itself."""
    blocks = anchors.shape[1]
    rows = torch.arange(blocks * block_size, device=anchors.device) // block_size  # each row's block
    row_anchor = anchors.repeat_interleave(block_size, dim=1)  # [B, N x block]
    sees_context = torch.arange(context, device=anchors.device) < row_anchor[..., None]
    sees_context &= real.repeat_interleave(block_size, dim=1)[..., None]
    same_block = (rows[:, None] == rows[None, :]).expand(anchors.shape[0], -1, -1)
    return torch.cat([sees_context, same_block], dim=-1)[:, None]


def dflash_loss(drafter: DFlashDrafter, vocab: DraftVocabulary, embedding: nn.Embedding, batch,
                anchors_per_sequence: int, decay_gamma: float, generator: torch.Generator | None = None):
    """The paper's loss: weighted mean over the drafted block positions k = 1 .. block-1 of exp(-(k-1)/gamma) x
    cross-entropy against the target's own next token (its argmax, `labels`), on answer positions. The block at
    anchor a holds [ids[a], mask, ...] at positions a .. a+block-1 and sees the target's features of positions < a.
    Returns (loss, per block position k: (logits [n, V'], target slice positions [n]))."""
    hidden, ids, labels, mask = batch.hidden, batch.input_ids, batch.labels, batch.mask
    size, (batches, length) = drafter.block_size, ids.shape
    anchors, real = sample_anchors(mask, anchors_per_sequence, generator)
    offsets = torch.arange(size, device=ids.device)
    block_ids = torch.full((*anchors.shape, size), drafter.mask_token_id, dtype=torch.long, device=ids.device)
    block_ids[..., 0] = ids.gather(1, anchors)
    positions = (anchors[..., None] + offsets).flatten(1)
    weight = drafter.fc.weight
    context = drafter.context_cache(hidden.to(weight.dtype), torch.arange(length, device=ids.device)[None])
    out = drafter(embedding(block_ids.flatten(1)).to(weight.dtype), positions, context,
                  block_attention_mask(anchors, real, length, size))
    out = out.view(batches, -1, size, out.shape[-1])[:, :, 1:]  # rows 1 .. block-1 draft tokens a+1 .. a+block-1
    label_at = anchors[..., None] + offsets[:-1]  # token a+k is labels[a+k-1]
    inside = label_at < length
    label_at = label_at.clamp(max=length - 1)
    targets = vocab.slice_positions(labels.gather(1, label_at.flatten(1)).view(label_at.shape))
    keep = inside & real[..., None] & mask.gather(1, label_at.flatten(1)).view(label_at.shape)
    decay = torch.exp(-torch.arange(size - 1, device=ids.device, dtype=torch.float32) / decay_gamma)
    logits = vocab(out[keep])
    losses = nn.functional.cross_entropy(logits.float(), targets[keep], ignore_index=-100, reduction="none")
    weights = decay.expand_as(keep)[keep] * (targets[keep] != -100)
    loss = (losses * weights).sum() / weights.sum().clamp_min(1e-6)
    column = offsets[:-1].expand_as(keep)[keep]
    outputs = [(logits[column == k].detach(), targets[keep][column == k]) for k in range(size - 1)]
    return loss, outputs


class DFlashRecipe:
    """Training recipe for methods/heads/training.py: a DFlashDrafter of `train.num_layers` layers over the target's
    `train.target_layer_ids` (the feature cache stores them), its embedding and LM head the target's (frozen), the
    loss `dflash_loss`. Held-out agreement is per block position (depth k = 1 .. block-1). Written in the published
    layout (config.json of a DFlashDraftModel), with the draft vocabulary's ids beside the weights when it is a
    slice."""

    method = "dflash"
    per_depth = True

    def __init__(self, target_layer_ids: list[int], anchors_per_sequence: int = 512, decay_gamma: float = 7.0):
        self.layer_ids = list(target_layer_ids)
        self.anchors_per_sequence = anchors_per_sequence
        self.decay_gamma = decay_gamma

    def feature_layers(self, target) -> list[int]:
        return [layer + 1 for layer in self.layer_ids]

    def build(self, target, tcfg) -> DFlashDrafter:
        config = published_config(target.config, tcfg.num_layers, self.layer_ids, tcfg.block_size, tcfg.mask_token_id)
        drafter = DFlashDrafter(*drafter_config(config))
        for linear in drafter.modules():  # transformers' initialisation of a Qwen3 model (upstream's post_init)
            if isinstance(linear, nn.Linear):
                nn.init.normal_(linear.weight, std=drafter.config.initializer_range)
        drafter.published = config  # what checkpoint_config writes
        return drafter.train()

    def loss(self, module: DFlashDrafter, vocab: DraftVocabulary, batch, target):
        generator = None if module.training else torch.Generator().manual_seed(0)  # held-out: the same anchors
        return dflash_loss(module, vocab, target.get_input_embeddings(), batch, self.anchors_per_sequence,
                           self.decay_gamma, generator)

    def checkpoint_config(self, module: DFlashDrafter, tcfg) -> dict:
        return module.published
