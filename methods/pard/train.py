"""PARD's training recipe for methods/heads/training.py: the mask-token fine-tune of an autoregressive draft
(here the SpS draft, methods/sps/) so that one forward over prefix + K-1 masks predicts K tokens.

As upstream's `pard_train.py`: every training sequence is laid out as `train.recipe.num_blocks` blocks
(methods/pard/layout.py; upstream's `para_num`, 8 in its example configs) thinned by conditional drop-token
(`drop_ratio` 0.7, `drop_ratio_min` 0.2), one cross-entropy averaged over every kept labelled position of every
block (block 0 is the ordinary next-token loss, so the draft stays a draft). Differences, both from the shared
pipeline: the labels are the target's own argmax on its own answers (self-distilled; upstream trains on a corpus's
text), and only the answer positions are labelled (upstream's loss covers the prompt too).
"""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary
from methods.pard.checkpoints import mark_parallel
from methods.pard.layout import parallel_layout
from methods.sps.draft import load_draft, save_draft

TRAIN_COMMAND = "python -m bench.train method=pard"


def pard_loss(draft, vocab: DraftVocabulary, batch, mask_token_id: int, num_blocks: int, drop_ratio: float,
              drop_ratio_min: float, generator: torch.Generator | None = None):
    """PARD's loss on `batch` (Features: input_ids, labels = the target's argmax, mask = labelled positions). In
    training mode the layout is thinned by COD; in eval mode every position of every block is kept. Returns
    (loss, per block (logits [N, V'], targets [N]))."""
    batch_size, seq_len = batch.input_ids.shape
    if draft.training:
        layout = parallel_layout(seq_len, num_blocks, drop_ratio, drop_ratio_min, generator)
    else:
        layout = parallel_layout(seq_len, num_blocks)
    device = batch.input_ids.device
    block, position = layout.block.to(device), layout.position.to(device)
    ids = layout.input_ids(batch.input_ids, mask_token_id)
    attention = layout.attention().to(device)[None, None].expand(batch_size, 1, -1, -1)
    hidden = draft.model(input_ids=ids, attention_mask=attention,
                         position_ids=position[None].expand(batch_size, -1)).last_hidden_state  # [B, N, H]
    labelled = batch.mask[:, position]  # [B, N]
    targets = vocab.slice_positions(batch.labels[:, position])
    logits = vocab(hidden[labelled])
    chosen = targets[labelled]
    loss = nn.functional.cross_entropy(logits.float(), chosen, ignore_index=-100)
    which = block[None].expand(batch_size, -1)[labelled]
    outputs = [(logits[which == k].detach(), chosen[which == k]) for k in range(int(block.max()) + 1)]
    return loss, outputs


class PardRecipe:
    """Training recipe for methods/heads/training.py: the draft at `train.init_draft` (an SpS draft sharing the
    target's embedding and LM head, frozen) fine-tuned with PARD's layout and loss; saved as a standard HF draft
    folder with PARD's config fields (`pard_token`, `spd_type`)."""

    method = "pard"
    per_depth = True  # held-out agreement per draft position

    def __init__(self, mask_token_id: int = 16, num_blocks: int = 8, drop_ratio: float = 0.7,
                 drop_ratio_min: float = 0.2):
        self.mask_token_id, self.num_blocks = int(mask_token_id), int(num_blocks)
        self.drop_ratio, self.drop_ratio_min = drop_ratio, drop_ratio_min
        self.generator = torch.Generator().manual_seed(0)  # the COD draws

    def build(self, target, tcfg) -> nn.Module:
        draft = load_draft(tcfg.init_draft, target, TRAIN_COMMAND)
        mark_parallel(draft.config, self.mask_token_id)
        return draft

    def loss(self, module: nn.Module, vocab: DraftVocabulary, batch, target):
        return pard_loss(module, vocab, batch, self.mask_token_id, self.num_blocks, self.drop_ratio,
                         self.drop_ratio_min, self.generator)

    def checkpoint_config(self, module: nn.Module, tcfg) -> dict:
        return {"pard_token": self.mask_token_id, "num_blocks": self.num_blocks}

    def save(self, out_dir, module: nn.Module, card: dict) -> None:
        save_draft(module, out_dir, card)
