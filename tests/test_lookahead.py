"""Lookahead decoding: window attention and sliding, n-gram pool, candidate trie, output equals vanilla; the knobs
that select upstream's (lade's) behaviour."""
from __future__ import annotations

import random

import pytest
import torch

from bench.engine.acceptance import Acceptance
from bench.engine.drafter import StepResult
from bench.engine.loop import SpeculativeEngine
from methods.lookahead import LookaheadDrafter, window_layout
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config


def test_window_layout_is_the_upstream_mask():
    depths, mask = window_layout(columns=3, levels=2)
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
    tree = drafter.propose(prompt + [root], max_tokens=50)
    assert tree.tokens == [8, 9, 10, 11, 12] and tree.parents == [-1, 0, 1, 0, 3]
    target = SpeculativeEngine(tiny_model).target
    with torch.inference_mode():
        target.prefill(prompt, 50)
        logits, _ = target.verify(root, tree)
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
    logits[-len(top) :].scatter_(1, torch.tensor(top)[:, None], 1.0)
    return StepResult(tree, logits, Acceptance(list(range(len(accepted))), accepted))


def test_pool_takes_finished_columns_and_keeps_the_latest_g():
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=2)
    drafter.start([50, 51])
    drafter.base, drafter.levels = [10, 11], [[20, 21, 22], [30, 31, 32]]
    drafter.column_age = [2, 2, 1]  # column 2 has taken only one Jacobi step: its n-gram is not finished
    tree = drafter.propose([50, 51, 7], max_tokens=50)
    drafter.update(step_with_top_level(drafter, tree, top=[40, 41, 42], accepted=[1]))
    assert drafter.pool == {7: {(20, 30, 40): None}, 10: {(21, 31, 41): None}}

    drafter.remember(7, (1, 1, 1))
    drafter.remember(7, (20, 30, 40))  # seen again: now the most recent
    drafter.remember(7, (2, 2, 2))  # over G = 2: the least recently seen tail goes
    assert list(drafter.pool[7]) == [(20, 30, 40), (2, 2, 2)]


def test_pool_is_verified_as_a_trie_cut_to_max_tokens():
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=3)
    drafter.start([1, 2, 3])
    drafter.pool[3] = {(5, 6, 7): None, (5, 6, 8): None, (9, 1, 2): None}
    tree = drafter.propose([1, 2, 3], max_tokens=50)
    assert (tree.tokens, tree.parents) == ([5, 6, 7, 8, 9, 1, 2], [-1, 0, 1, 1, -1, 4, 5])
    assert tree.aux_tokens == drafter.base + drafter.levels[0] + drafter.levels[1]
    tree = drafter.propose([1, 2, 3], max_tokens=3)
    assert (tree.tokens, tree.parents) == ([5, 6, 9, 1], [-1, 0, -1, 2])
    assert drafter.propose([1, 2, 3], max_tokens=1) is None


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
    tree = drafter.propose(truth[: p + 1], max_tokens=50)
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
            steps.append(out.decode_steps)
        if knobs.get("window_size", 15) >= 4:
            assert min(steps) < 40  # pooled n-grams got accepted


def test_greedy_output_equals_vanilla_with_sliding_window(windowed_model, prompts, one_thread):
    """Trees (and the Jacobi window's aux nodes) on a model with sliding-window attention, prompts and answers longer
    than the window."""
    knobs = {"window_size": 4, "ngram_size": 3, "guess_set_size": 4}
    outs = [assert_lossless(windowed_model, LookaheadDrafter(**knobs), prompt, 40) for prompt in prompts]
    assert min(out.decode_steps for out in outs) < 40


def test_config_builds_the_drafter_with_upstream_knobs(tiny_model):
    drafter = drafter_from_config("lookahead", tiny_model, None)
    assert isinstance(drafter, LookaheadDrafter) and (drafter.W, drafter.N, drafter.G) == (15, 5, 15)
    assert (drafter.initial_window, drafter.max_accept, drafter.slide) == ("ours", "n", "accepted")
    drafter = drafter_from_config("lookahead", tiny_model, None, "method.drafter.initial_window=upstream",
                                  "method.drafter.max_accept=n_minus_1", "method.drafter.slide=one")
    assert (drafter.initial_window, drafter.max_accept, drafter.slide) == ("upstream", "n_minus_1", "one")


@pytest.mark.parametrize("knob", ["initial_window", "max_accept", "slide"])
def test_unknown_knob_value_is_refused_with_the_choices(knob):
    with pytest.raises(ValueError, match=f"method.drafter.{knob}"):
        LookaheadDrafter(**{knob: "lade"})


UPSTREAM = {"initial_window": "upstream", "max_accept": "n_minus_1", "slide": "one", "seed": 10}


def test_max_accept_n_minus_1_verifies_all_but_each_ngrams_last_token():
    pool = {(5, 6, 7): None, (5, 6, 8): None, (9, 1, 2): None}
    for max_accept, expected in (("n", ([5, 6, 7, 8, 9, 1, 2], [-1, 0, 1, 1, -1, 4, 5])),
                                 ("n_minus_1", ([5, 6, 9, 1], [-1, 0, -1, 2]))):
        drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=3, max_accept=max_accept)
        drafter.start([1, 2, 3])
        drafter.pool[3] = dict(pool)
        tree = drafter.propose([1, 2, 3], max_tokens=50)
        assert (tree.tokens, tree.parents) == expected


@pytest.mark.parametrize("W, N, G", [(4, 3, 4), (5, 4, 5)])
def test_max_accept_caps_the_tokens_of_a_step(tiny_model, prompts, one_thread, W, N, G):
    """On the tiny model some step accepts a whole n-gram plus the bonus token (N) by default; with n_minus_1 no step
    accepts more than N - 1 (lade's cap), and both equal vanilla."""
    for max_accept, most in (("n", N), ("n_minus_1", N - 1)):
        outs = [assert_lossless(tiny_model, LookaheadDrafter(window_size=W, ngram_size=N, guess_set_size=G,
                                                             max_accept=max_accept), prompt, 40) for prompt in prompts]
        assert max(max(out.accept_lengths) for out in outs) == most


def test_upstream_initial_window_grows_a_level_per_step_then_pools_every_column():
    """lade's window: W+N-3 context tokens (random.seed(10) then random.choice, as lade draws them) verified as a
    causal chain; each step drops the leftmost column and the top level's predictions become the next level; once
    N-2 levels are there, every column's n-gram is pooled, a column of fresh guesses too."""
    W, N, context = 3, 4, [50, 51, 52, 53, 54, 55]
    drafter = LookaheadDrafter(window_size=W, ngram_size=N, guess_set_size=4, initial_window="upstream", seed=10)
    drafter.start(context)
    lade = random.Random(10)
    assert drafter.base == [lade.choice(context) for _ in range(W + N - 3)] and drafter.levels == []
    base0 = list(drafter.base)

    tree = drafter.propose(context + [7], max_tokens=50)
    assert tree.aux_tokens == base0 and tree.aux_depths == [1, 2, 3, 4]
    assert torch.equal(tree.aux_mask, torch.ones(4, 4, dtype=torch.bool).tril())
    drafter.update(step_with_top_level(drafter, tree, top=[10, 11, 12, 13], accepted=[8]))
    assert (drafter.base, drafter.levels, drafter.pool) == (base0[1:], [[10, 11, 12, 13]], {})

    tree = drafter.propose(context + [7, 8], max_tokens=50)
    assert tree.aux_tokens == base0[1:] + [10, 11, 12, 13]
    drafter.update(step_with_top_level(drafter, tree, top=[20, 21, 22, 23], accepted=[9]))
    assert (drafter.base, drafter.levels, drafter.pool) == (base0[2:], [[11, 12, 13], [21, 22, 23]], {})

    drafter.column_age = [0] * W  # fresh guesses everywhere: ours would pool nothing, lade pools them all
    tree = drafter.propose(context + [7, 8, 9], max_tokens=50)
    drafter.update(step_with_top_level(drafter, tree, top=[30, 31, 32], accepted=[4]))
    pooled = {(key, tail) for key, tails in drafter.pool.items() for tail in tails}
    assert pooled == {(9, (11, 21, 30)), (base0[2], (12, 22, 31)), (base0[3], (13, 23, 32))}


def test_ours_pools_only_columns_that_took_n_minus_2_jacobi_steps():
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=4)
    drafter.start([50, 51])
    drafter.column_age = [0] * 3
    tree = drafter.propose([50, 51, 7], max_tokens=50)
    drafter.update(step_with_top_level(drafter, tree, top=[30, 31, 32], accepted=[4]))
    assert drafter.pool == {}


def test_slide_one_moves_the_window_one_column_whatever_was_accepted():
    """lade's ALWAYS_FWD_ONE=1: after 3 accepted tokens the levels still move up one level and one column, the top
    level's predictions become the last level, and no fresh guesses are drawn."""
    drafter = LookaheadDrafter(window_size=3, ngram_size=4, guess_set_size=4, slide="one")
    drafter.start([50, 51])
    drafter.base, drafter.levels = [10, 11], [[20, 21, 22], [30, 31, 32]]
    tree = drafter.propose([50, 51, 7], max_tokens=50)
    draws = drafter.rng.getstate()
    drafter.update(step_with_top_level(drafter, tree, top=[40, 41, 42], accepted=[1, 2, 3]))
    assert (drafter.base, drafter.levels) == ([21, 22], [[30, 31, 32], [40, 41, 42]])
    assert drafter.rng.getstate() == draws


@pytest.mark.parametrize("knobs", [UPSTREAM, {"initial_window": "upstream"}, {"slide": "one"}])
def test_greedy_output_equals_vanilla_with_upstream_knobs(tiny_model, windowed_model, prompts, one_thread, knobs):
    sizes = ({"window_size": 4, "ngram_size": 3, "guess_set_size": 4},
             {"window_size": 5, "ngram_size": 4, "guess_set_size": 5}, {})
    for model in (tiny_model, windowed_model):
        outs = [assert_lossless(model, LookaheadDrafter(**size, **knobs), prompt, 40) for size in sizes
                for prompt in prompts]
        assert min(out.decode_steps for out in outs) < 40  # pooled n-grams got accepted


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    assert assert_lossless_on_smollm2("lookahead") >= 1.0
