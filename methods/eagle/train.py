"""EAGLE's training recipe (methods/heads/training.py): EAGLE-1's objective unrolled as EAGLE-3's training-time test."""
from __future__ import annotations

import torch
from torch import nn

from bench.engine.kvcache import new_cache
from methods.eagle.head import EagleHead
from methods.heads.common import DraftVocabulary


def unrolled_mask(length: int, step: int, batch: int, device: torch.device) -> torch.Tensor:
    """[batch, 1, length, (step + 1) x length] bool (True: attend) of unrolled step `step` over the head's cache of the
    earlier steps: the query at position t (the draft `step` tokens beyond t) sees the step-0 keys 0..t (the
    target's real features up to t) and, of each later step, only the key at t (its own earlier draft positions)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * step, dim=-1)[None, None].expand(batch, 1, -1, -1)


def ahead(values: torch.Tensor, shift: int, length: int) -> torch.Tensor:
    """values[:, shift : shift + length], zero-padded (False for masks) at the end to `length` positions."""
    out = values[:, shift : shift + length]
    missing = length - out.shape[1]
    if missing <= 0:
        return out
    return torch.cat([out, out.new_zeros((out.shape[0], missing, *out.shape[2:]))], dim=1)


def eagle_loss(head: EagleHead, vocab: DraftVocabulary, embed: nn.Embedding, batch, noise: float = 0.2,
               feature_weight: float = 1.0, token_weight: float = 0.1, ttt_steps: int = 1, ttt_decay: float = 0.8,
               eval_depths: int = 4):
    """EAGLE's objective on a batch of cached features, with EAGLE-3's training-time test: sum over unrolled steps
    k < ttt_steps of ttt_decay^k x (SmoothL1 between the predicted and the target's feature + token_weight x
    cross-entropy against the target's next prediction). Input features (step 0's) get uniform noise
    U(-noise/2, noise/2) in training. Returns (loss, [(logits [N, V'], target slice positions [N]) per step]).

    Step 0 at position t reads (token t+1, the target's feature f_t) and predicts f_{t+1}, teacher-forced as EAGLE-1.
    Step k at t reads (token t+k+1, the head's own step k-1 output at t, its guess of f_{t+k}) at rotary position
    t+k and predicts f_{t+k+1}, attending to the real features 0..t and its own steps 1..k at t (`unrolled_mask`):
    exactly what drafting k+1 tokens beyond an accepted position t computes, the draft's tokens taken as the
    corpus's. In eval mode max(ttt_steps, eval_depths) steps are unrolled, for the held-out agreement per depth.
    A batch with soft targets (Features.soft_logprobs: over its soft_ids, or with soft_ids None over the whole draft
    vocabulary) has its cross-entropy taken against the target's distribution (`soft_cross_entropy`) instead of its
    argmax."""
    features, outputs = batch.hidden[:, :-1], []  # f_t, for token t+1
    if head.training and noise:
        features = features + (torch.rand_like(features) - 0.5) * noise
    rows, length = features.shape[:2]
    steps = ttt_steps if head.training else max(ttt_steps, eval_depths)
    cache = new_cache() if steps > 1 else None
    positions = torch.arange(length, device=features.device)[None].expand(rows, -1)
    # never below float32
    loss = batch.hidden.new_zeros((), dtype=torch.promote_types(batch.hidden.dtype, torch.float32))
    for step in range(steps if length else 0):
        with torch.no_grad():
            embeds = embed(ahead(batch.input_ids, step + 1, length))  # token t+step+1
        mask = None if step == 0 else unrolled_mask(length, step, rows, features.device)
        predicted = head(embeds, features, cache=cache, position_ids=None if step == 0 else positions + step,
                         attention_mask=mask)  # f^_{t+step+1}
        keep = ahead(batch.mask, step + 1, length)
        targets = vocab.slice_positions(ahead(batch.labels, step + 1, length)[keep])  # the target's next token
        logits = vocab(predicted[keep])
        if step < ttt_steps and keep.any():
            soft_ids = None if batch.soft_ids is None else ahead(batch.soft_ids, step + 1, length)[keep]
            soft = None if batch.soft_logprobs is None else (
                None if soft_ids is None else vocab.slice_positions(soft_ids),
                ahead(batch.soft_logprobs, step + 1, length)[keep])
            loss = loss + ttt_decay ** step * step_loss(predicted[keep], ahead(batch.hidden, step + 1, length)[keep],
                                                        logits, targets, feature_weight, token_weight, loss.dtype, soft)
        outputs.append((logits.detach(), targets))
        features = predicted
    return loss, outputs


def step_loss(predicted: torch.Tensor, wanted: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
              feature_weight: float, token_weight: float, dtype: torch.dtype,
              soft: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One unrolled step's loss: feature_weight x SmoothL1(predicted, wanted feature) + token_weight x cross-entropy
    of the logits against the target slice positions (-100: ignored), or against `soft` (the target's top-k as
    slice positions and log-probabilities: `soft_cross_entropy`). A zero weight drops its term (EAGLE-3 has no
    feature loss, and its features are wider than the head's outputs); so does a step whose targets all lie outside
    the draft vocabulary (cross-entropy over no positions is NaN)."""
    loss = predicted.new_zeros((), dtype=dtype)
    if feature_weight:
        loss = loss + feature_weight * nn.functional.smooth_l1_loss(predicted.to(dtype), wanted.to(dtype))
    if token_weight and bool((targets != -100).any()):
        token_loss = (nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100) if soft is None
                      else soft_cross_entropy(logits, targets, *soft))
        loss = loss + token_weight * token_loss
    return loss


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, soft_positions: torch.Tensor,
                       soft_logprobs: torch.Tensor) -> torch.Tensor:
    """Mean over the rows whose target argmax lies in the draft vocabulary (targets != -100) of -sum_j p_j log q_j:
    q the draft's softmax over its vocabulary (logits [N, V']), p the target's distribution over the draft
    vocabulary (SafeAILab's EAGLE-3 loss), known here from the target's top-k (soft_positions [N, k], their slice
    positions, -100 outside the slice; soft_logprobs [N, k]) and renormalised over those inside the slice, or, with
    soft_positions None, from the target's log-probabilities over the whole draft vocabulary (soft_logprobs [N, V'])."""
    valid = targets != -100
    if soft_positions is None:
        weights = soft_logprobs[valid].float().softmax(-1)
        return -(weights * logits[valid].float().log_softmax(-1)).sum(-1).mean()
    positions, inside = soft_positions[valid], soft_positions[valid] != -100
    weights = soft_logprobs[valid].float().masked_fill(~inside, float("-inf")).softmax(-1)
    logq = logits[valid].float().log_softmax(-1).gather(-1, positions.clamp(min=0))
    return -(weights * logq).masked_fill(~inside, 0.0).sum(-1).mean()


class EagleRecipe:
    """Training recipe for methods/heads/training.py (EAGLE-1's objective, unrolled `ttt_steps` steps as EAGLE-3's
    training-time test; EAGLE-2 uses the same weights). Held-out agreement is per draft depth."""

    method = "eagle"
    per_depth = True

    def __init__(self, noise: float = 0.2, feature_weight: float = 1.0, token_weight: float = 0.1, ttt_steps: int = 1,
                 ttt_decay: float = 0.8):
        self.noise, self.feature_weight, self.token_weight = noise, feature_weight, token_weight
        self.ttt_steps, self.ttt_decay = ttt_steps, ttt_decay

    def build(self, target, tcfg) -> EagleHead:
        return EagleHead(target.config)

    def loss(self, module: EagleHead, vocab: DraftVocabulary, batch, target):
        return eagle_loss(module, vocab, target.get_input_embeddings(), batch, self.noise, self.feature_weight,
                          self.token_weight, self.ttt_steps, self.ttt_decay)

    def checkpoint_config(self, module: EagleHead, tcfg) -> dict:
        return {"hidden_size": module.fc.out_features}
