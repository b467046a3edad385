"""MLPSpeculator's training recipe (methods/heads/training.py): every stage teacher-forced on the corpus tokens."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary
from methods.mlp_speculator.head import MLPSpeculatorStages, SharedVocabMLPSpeculator, candidate_settings


def mlp_speculator_loss(stages: MLPSpeculatorStages, vocab: DraftVocabulary, batch, decay: float = 1.0):
    """Sum over stages of decay^k x cross-entropy against the target's own predictions, teacher-forced as fms-extras
    trains (the stages run on the corpus tokens, not on their own guesses): at position t stage 0 reads h_t and
    ids[t+1], stage k the state of stage k-1 and ids[t+k+1]; stage k is trained on labels[t+k+1] (the token
    t+k+2). Returns (loss, per-stage (logits [N, V'], targets [N]))."""
    hidden, ids, labels, mask = batch.hidden, batch.input_ids, batch.labels, batch.mask
    state = stages.first_state(hidden[:, :-1].to(stages.proj[0].weight.dtype))  # [B, S-1, H]
    total, outputs = hidden.new_zeros((), dtype=torch.float32), []
    seq = hidden.shape[1]
    for k in range(stages.n_predict):
        span = seq - k - 1  # positions t with t + k + 1 < S
        state = stages.advance(k, state[:, :span], ids[:, k + 1 : k + 1 + span])
        keep = mask[:, k + 1 :]
        logits = stages.logits(k, state[keep], vocab)
        targets = vocab.slice_positions(labels[:, k + 1 :][keep])
        total = total + decay ** k * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


class MLPSpeculatorRecipe:
    """Training recipe for methods/heads/training.py: `n_predict` stages of SharedVocabMLPSpeculator over the target's
    embedding and LM head (or its draft-vocabulary slice)."""

    method = "mlp_speculator"

    def __init__(self, decay: float = 1.0):
        self.decay = decay

    def build(self, target, tcfg) -> SharedVocabMLPSpeculator:
        hidden_size = target.get_output_embeddings().weight.shape[1]
        stages = SharedVocabMLPSpeculator(hidden_size, tcfg.n_predict, bool(tcfg.scale_input))
        return stages.attach_embedding(target.get_input_embeddings())

    def loss(self, module: SharedVocabMLPSpeculator, vocab: DraftVocabulary, batch, target):
        return mlp_speculator_loss(module, vocab, batch, self.decay)

    def checkpoint_config(self, module: SharedVocabMLPSpeculator, tcfg) -> dict:
        return {"n_predict": module.n_predict, "scale_input": module.ln0 is not None,
                **candidate_settings(module.n_predict)}
