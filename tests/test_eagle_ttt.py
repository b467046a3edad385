"""EAGLE's training-time test (methods/eagle/train.py eagle_loss): the unrolled steps are what autoregressive drafting
computes from each position, and one step is EAGLE-1's objective exactly."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from methods.eagle.head import EagleHead
from methods.eagle.train import eagle_loss, unrolled_mask
from methods.heads.common import DraftVocabulary
from methods.heads.features import Features
from tests.conftest import VOCAB, tiny_config

SEQ = 9


@pytest.fixture(scope="module")
def parts():
    """(head, embedding, vocabulary, batch) in float64, with a mask that leaves some positions out."""
    torch.manual_seed(0)
    config = tiny_config()
    head = EagleHead(config).double().train()
    embed = nn.Embedding(VOCAB, config.hidden_size).double()
    lm_head = nn.Linear(config.hidden_size, VOCAB, bias=False).double()
    generator = torch.Generator().manual_seed(1)
    batch = Features(torch.randint(VOCAB, (2, SEQ), generator=generator),
                     torch.randn(2, SEQ, config.hidden_size, generator=generator, dtype=torch.float64),
                     torch.randint(VOCAB, (2, SEQ), generator=generator),
                     torch.rand(2, SEQ, generator=generator) > 0.3)
    return head, embed, DraftVocabulary(lm_head), batch


def objective(predicted, wanted, logits, targets, feature_weight=1.0, token_weight=0.1):
    return (feature_weight * nn.functional.smooth_l1_loss(predicted, wanted)
            + token_weight * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100))


def test_one_step_is_eagle_1s_teacher_forced_loss_exactly(parts):
    head, embed, vocab, batch = parts
    loss, outputs = eagle_loss(head, vocab, embed, batch, noise=0.0, ttt_steps=1)
    predicted = head(embed(batch.input_ids[:, 1:]), batch.hidden[:, :-1])
    keep = batch.mask[:, 1:]
    expected = objective(predicted[keep], batch.hidden[:, 1:][keep], vocab(predicted[keep]), batch.labels[:, 1:][keep])
    assert len(outputs) == 1 and torch.equal(loss, expected)


def drafted_features(head, embed, batch, steps: int) -> list[dict]:
    """By hand: from every position t, the head fed the real prefix (tokens 1..t+1, features 0..t) with its own
    cache, then drafting one token at a time on its own last output at rotary position t+k: {(row, t): feature}."""
    per_step = [{} for _ in range(steps)]
    for row in range(batch.input_ids.shape[0]):
        for t in range(SEQ - 1):
            cache = DynamicCache()
            out = head(embed(batch.input_ids[row : row + 1, 1 : t + 2]), batch.hidden[row : row + 1, : t + 1],
                       cache=cache)[:, -1:]
            per_step[0][row, t] = out[0, 0]
            for k in range(1, steps):
                if t + k + 1 >= SEQ:
                    break
                out = head(embed(batch.input_ids[row : row + 1, t + k + 1 : t + k + 2]), out, cache=cache,
                           position_ids=torch.tensor([[t + k]]))
                per_step[k][row, t] = out[0, 0]
    return per_step


def test_unrolled_steps_equal_drafting_by_hand_from_every_position(parts):
    head, embed, vocab, batch = parts
    steps, decay = 3, 0.8
    loss, outputs = eagle_loss(head, vocab, embed, batch, noise=0.0, ttt_steps=steps, ttt_decay=decay)
    expected = torch.zeros((), dtype=torch.float64)
    for k, drafted in enumerate(drafted_features(head, embed, batch, steps)):
        kept = [(row, t) for (row, t) in sorted(drafted) if batch.mask[row, t + k + 1]]
        predicted = torch.stack([drafted[key] for key in kept])
        wanted = torch.stack([batch.hidden[row, t + k + 1] for row, t in kept])
        targets = torch.stack([batch.labels[row, t + k + 1] for row, t in kept])
        logits, output_targets = outputs[k]
        torch.testing.assert_close(logits, vocab(predicted).detach(), atol=1e-9, rtol=1e-9)
        assert torch.equal(output_targets, targets)
        expected = expected + decay ** k * objective(predicted, wanted, vocab(predicted), targets)
    torch.testing.assert_close(loss, expected, atol=1e-9, rtol=1e-9)


def test_eval_mode_unrolls_four_depths_for_the_agreement(parts):
    head, embed, vocab, batch = parts
    head.eval()
    try:
        _, outputs = eagle_loss(head, vocab, embed, batch, noise=0.2, ttt_steps=1)
    finally:
        head.train()
    assert [len(t) for _, t in outputs] == [int(batch.mask[:, k + 1 :].sum()) for k in range(4)]


def test_unrolled_mask_sees_the_real_prefix_and_its_own_diagonal():
    mask = unrolled_mask(3, 2, 1, torch.device("cpu"))[0, 0].int()
    assert mask.tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0, 0, 1, 0],
                             [1, 1, 1, 0, 0, 1, 0, 0, 1]]
