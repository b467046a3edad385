"""Lookahead decoding: window attention and sliding, n-gram pool, candidate trie, output equals vanilla."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from bench.engine.acceptance import Acceptance
from bench.engine.loop import SpeculativeEngine
from bench.engine.drafter import StepResult
from methods.lookahead import LookaheadDrafter, window_layout
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config


def test_window_layout_is_the_upstream_mask():
    depths, mask = window_layout(window_size=3, ngram_size=4)
    # aux nodes: base b0 b1 | level 1 columns 0-2 | level 2 columns 0-2
    assert depths == [1, 2, 1, 2, 3, 2, 3, 4]
    b0, b1, l1c0, l1c1, l1c2, l2c0, l2c1, l2c2 = range(8)
    sees = {b0: {b0}, b1: {b0, b1}, l1c0: {l1c0}, l1c1: {b0, l1c1}, l1c2: {b0, b1, l1c2},
            l2c0: {l1c0, l2c0}, l2c1: {b0, l1c1, l2c1}, l2c2: {b0, b1, l1c2, l2c2}}
    assert {row: set(mask[row].nonzero().flatten().tolist()) for row in range(8)} == sees


def test_aux_rows_are_scored_as_their_own_sequences(tiny_model, prompts):
    """Every window token's verifier logits equal decoding root + the tokens it attends to on their own; candidate
    rows are unaffected by the window (engine mask built from aux_tokens / aux_depths / aux_mask)."""
    prompt = prompts[1]
    drafter = LookaheadDrafter(window_size=4, ngram_size=4, guess_set_size=2)
    drafter.start(prompt)
    root = 7
    drafter.pool[root] = {(8, 9, 10): None, (8, 11, 12): None}
    tree = drafter.propose(prompt + [root], budget=50)
    assert tree.tokens == [8, 9, 10, 11, 12] and tree.parents == [-1, 0, 1, 0, 3]
    engine = SpeculativeEngine(tiny_model)
    with torch.inference_mode():
        cache = DynamicCache(config=tiny_model.config)
        tiny_model(input_ids=torch.tensor([prompt]), cache=cache)
        logits = tiny_model(**engine._verify_inputs(root, tree, len(prompt)), cache=cache).logits[0]
        n = len(tree)
        for row, depth in enumerate(tree.aux_depths):
            seen = sorted(tree.aux_mask[row].nonzero().flatten().tolist(), key=lambda k: tree.aux_depths[k])
            assert [tree.aux_depths[k] for k in seen] == list(range(1, depth + 1))  # a gap-free path from the root
            path = [tree.aux_tokens[k] for k in seen]
            alone = tiny_model(input_ids=torch.tensor([prompt + [root] + path])).logits[0, -1]
            torch.testing.assert_close(logits[1 + n + row], alone)
        for node, path in enumerate([[8], [8, 9], [8, 9, 10], [8, 11], [8, 11, 12]]):
            alone = tiny_model(input_ids=torch.tensor([prompt + [root] + path])).logits[0, -1]
            torch.testing.assert_close(logits[1 + node], alone)


def step_with_top_level(drafter, tree, top: list[int], accepted: list[int]) -> StepResult:
    """A verification result whose top-level rows predict `top` and which accepted `accepted`."""
    logits = torch.zeros(1 + len(tree) + len(tree.aux_tokens), max(top) + 1)
    logits[-drafter.W :].scatter_(1, torch.tensor(top)[:, None], 1.0)
    return StepResult(tree, logits, Acceptance(list(range(len(accepted))), accepted))


def test_pool_takes_finished_columns_and_keeps_the_latest_g():
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=2)
    drafter.start([50, 51])
    drafter.base, drafter.levels = [10, 11], [[20, 21, 22], [30, 31, 32]]
    drafter.column_age = [2, 2, 1]  # column 2 has taken only one Jacobi step: its n-gram is not finished
    tree = drafter.propose([50, 51, 7], budget=50)
    drafter.update(step_with_top_level(drafter, tree, top=[40, 41, 42], accepted=[1]))
    assert drafter.pool == {7: {(20, 30, 40): None}, 10: {(21, 31, 41): None}}

    drafter.remember(7, (1, 1, 1))
    drafter.remember(7, (20, 30, 40))  # seen again: now the most recent
    drafter.remember(7, (2, 2, 2))  # over G = 2: the least recently seen tail goes
    assert list(drafter.pool[7]) == [(20, 30, 40), (2, 2, 2)]


def test_pool_is_verified_as_a_trie_cut_to_the_budget():
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=3)
    drafter.start([1, 2, 3])
    drafter.pool[3] = {(5, 6, 7): None, (5, 6, 8): None, (9, 1, 2): None}
    tree = drafter.propose([1, 2, 3], budget=50)
    assert (tree.tokens, tree.parents) == ([5, 6, 7, 8, 9, 1, 2], [-1, 0, 1, 1, -1, 4, 5])
    assert tree.aux_tokens == drafter.base + drafter.levels[0] + drafter.levels[1]
    tree = drafter.propose([1, 2, 3], budget=3)
    assert (tree.tokens, tree.parents) == ([5, 6, 9, 1], [-1, 0, -1, 2])
    assert drafter.propose([1, 2, 3], budget=1) is None


@pytest.mark.parametrize("advance", [1, 2, 3, 4, 5, 6])
def test_window_keeps_every_guess_at_its_position(advance):
    """Window filled with the true text (token = 1000 + position): after `advance` accepted tokens, each kept
    guess still sits at its position relative to the new root; only the emptied right columns are fresh."""
    W, N, p = 4, 4, 10
    truth = [1000 + position for position in range(40)]
    drafter = LookaheadDrafter(window_size=W, ngram_size=N)
    drafter.start(truth[: p + 1])
    drafter.base = [truth[p + 1 + i] for i in range(W - 1)]
    drafter.levels = [[truth[p + j + level] for j in range(W)] for level in range(1, N - 1)]
    drafter.column_age = [5, 6, 7, 8]
    tree = drafter.propose(truth[: p + 1], budget=50)
    top = [truth[p + j + N - 1] for j in range(W)]
    drafter.update(step_with_top_level(drafter, tree, top, accepted=truth[p + 1 : p + 1 + advance]))
    q, kept = p + advance, max(W - (advance - 1), 0)  # the new root's position, columns that survive
    kept_base = max(kept - 1, 0)
    assert drafter.base[:kept_base] == [truth[q + 1 + i] for i in range(kept_base)]
    for level, guesses in enumerate(drafter.levels, start=1):
        assert guesses[:kept] == [truth[q + j + level] for j in range(kept)]
    fresh = drafter.base[kept_base:] + [t for guesses in drafter.levels for t in guesses[kept:]]
    assert len(fresh) == (N - 1) * W - 1 - (N - 1) * kept + (1 if kept else 0)
    assert all(t <= truth[p] for t in fresh)  # new guesses are drawn from the context
    assert drafter.column_age == ([6, 7, 8, 9][advance - 1 :] + [0] * 4)[:W]


def test_greedy_output_equals_vanilla(tiny_model, prompts, one_thread):
    for knobs in ({}, {"window_size": 4, "ngram_size": 3, "guess_set_size": 4}, {"window_size": 2, "ngram_size": 3,
                                                                                  "guess_set_size": 1}):
        steps = []
        for prompt in prompts:
            out = assert_lossless(tiny_model, LookaheadDrafter(**knobs), prompt, 40)
            steps.append(out.steps)
        if knobs.get("window_size", 15) >= 4:
            assert min(steps) < 40  # pooled n-grams got accepted


def test_greedy_output_equals_vanilla_with_sliding_window(windowed_model, prompts, one_thread):
    """Trees (and the Jacobi window's aux nodes) on a model with sliding-window attention, prompts and answers longer
    than the window."""
    knobs = {"window_size": 4, "ngram_size": 3, "guess_set_size": 4}
    outs = [assert_lossless(windowed_model, LookaheadDrafter(**knobs), prompt, 40) for prompt in prompts]
    assert min(out.steps for out in outs) < 40


def test_config_builds_the_drafter_with_upstream_knobs(tiny_model):
    drafter = drafter_from_config("lookahead", tiny_model, None)
    assert isinstance(drafter, LookaheadDrafter) and (drafter.W, drafter.N, drafter.G) == (15, 5, 15)


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    assert assert_lossless_on_smollm2("lookahead") >= 1.0
