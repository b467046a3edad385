"""ReDrafter's training recipe (methods/heads/training.py): upstream's drafter loss on the target's own answers."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary
from methods.redrafter.head import RecurrentDrafterHead, SharedVocabRecurrentDrafter


def redrafter_loss(drafter: RecurrentDrafterHead, vocab: DraftVocabulary, batch, predict_n_tokens: int):
    """apple/ml-recurrent-drafter's `drafter_loss`: the unweighted sum over k = 0 .. predict_n_tokens-1 of the
    cross-entropy of step k, teacher-forced as upstream's `ReDrafter.forward` runs it (the state advances on the
    corpus tokens). At position t the context is h_t and step k's state has read ids[t+1 .. t+k+1]; it is trained on
    labels[t+k+1], the target's own next token there (the self-distilled answers make this the paper's distillation
    from the target). Upstream wraps around the sequence end with torch.roll; here those positions are left out.
    Returns (loss, per-step (logits [N, V'], targets [N]))."""
    hidden, ids, labels, mask = batch.hidden, batch.input_ids, batch.labels, batch.mask
    dtype = drafter.lm_head[-1].weight.dtype
    seq = hidden.shape[1]
    context = hidden[:, :-1].to(dtype)
    state = context.new_zeros(context.shape)
    total, outputs = hidden.new_zeros((), dtype=torch.float32), []
    for k in range(predict_n_tokens):
        span = seq - k - 1  # positions t with t + k + 1 < S
        state = drafter.advance(state[:, :span], ids[:, k + 1 : k + 1 + span])
        keep = mask[:, k + 1 :]
        logits = drafter.logits(context[:, :span][keep], state[keep], vocab)
        targets = vocab.slice_positions(labels[:, k + 1 :][keep])
        total = total + nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


class ReDrafterRecipe:
    """Training recipe for methods/heads/training.py: SharedVocabRecurrentDrafter over the target's embedding and LM
    head (or its draft-vocabulary slice)."""

    method = "redrafter"

    def __init__(self, predict_n_tokens: int = 5):
        self.predict_n_tokens = predict_n_tokens

    def build(self, target, tcfg) -> SharedVocabRecurrentDrafter:
        hidden_size = target.get_output_embeddings().weight.shape[1]
        drafter = SharedVocabRecurrentDrafter(hidden_size, tcfg.num_draft_layers, bool(tcfg.rnn), tcfg.exit_dim)
        return drafter.attach_embedding(target.get_input_embeddings())

    def loss(self, module: SharedVocabRecurrentDrafter, vocab: DraftVocabulary, batch, target):
        return redrafter_loss(module, vocab, batch, self.predict_n_tokens)

    def checkpoint_config(self, module: SharedVocabRecurrentDrafter, tcfg) -> dict:
        return {"hidden_size": module.hidden_size, "exit_dim": module.exit_dim,
                "num_draft_layers": module.num_draft_layers, "rnn": module.rnn}
