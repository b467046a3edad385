"""Upper bounds on a run's speedup from its recorded steps (bench/planning/bounds.py), on hand-built records."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.measure.metrics import summarize
from bench.planning.bounds import bounds_row, oracle_combine, speedup_bounds
from bench.planning.costmodel import Profile, predicted_speedup

LENGTHS, CONTEXTS = [1, 2, 4, 8], [0, 1000]


def profile(chain: list[float], tree: list[float] | None = None) -> Profile:
    """t(L) at L = 1, 2, 4, 8, the same at every context."""
    return Profile(setting={}, lengths=LENGTHS, contexts=CONTEXTS, seconds=[chain, chain],
                   tree_seconds=None if tree is None else [tree, tree])


def turn(accepts, drafted, aux=None, trees=None, prompt=10, prefill=1.0, draft=0.0) -> dict:
    """One turn's fields: its decode steps' accept lengths, drafted nodes and auxiliary inputs."""
    aux = aux or [0] * len(accepts)
    return {"decoding_steps": len(accepts), "accept_lengths": list(accepts), "new_tokens": 1 + sum(accepts),
            "prompt_tokens": prompt, "drafted_tokens": list(drafted), "tree_steps": trees or [False] * len(accepts),
            "verified_tokens": [1 + d + x for d, x in zip(drafted, aux)],
            "phase_times": {"prefill": prefill, "draft": draft, "verify": 0.0, "accept": 0.0}}


def record(qid: int, *turns: dict, category: str = "qa") -> dict:
    choice = {key: [t[key] for t in turns] for key in turns[0] if key != "accept_lengths"}
    choice["accept_lengths"] = [a for t in turns for a in t["accept_lengths"]]
    choice["wall_time"] = [1.0] * len(turns)
    return {"question_id": qid, "category": category, "exact_match": None, "choices": [choice]}


def test_constant_forward_time_oracle_keeps_only_the_accepted_drafts():
    """t = 1 s for any L: a step costs 1 s + its share of drafting (0.12 s a step, spread over its drafts), so the
    oracle drafts exactly what was accepted, and a fixed cap trades wasted drafts against one-token steps."""
    run = [record(1, turn([3, 1, 2], [4, 2, 3], draft=0.36))]  # 6 tokens after the prefill's; 0.03, 0.06, 0.04 s/draft
    bounds = speedup_bounds(run, profile([1.0, 1.0, 1.0, 1.0]))
    vanilla = 1.0 + 6  # prefill + one 1-s forward per token after the first
    assert bounds.replayed == pytest.approx(vanilla / (1.0 + 0.36 + 3))
    # k=0: plain decoding; k=1: 2 tokens (1.03) + 1 plain, 1 token (1.06), 2 tokens (1.04); k=2: 1.06, 1.12, 1.08;
    # k=3: 1.09, 1.12, 1.12; k=4: the run
    assert bounds.by_k == pytest.approx([1.0, vanilla / 5.13, vanilla / 4.26, vanilla / 4.33, vanilla / 4.36])
    assert (bounds.best_fixed_k, bounds.best_fixed_k_speedup) == (2, pytest.approx(vanilla / 4.26))
    assert bounds.oracle == pytest.approx(vanilla / (1.0 + 1.06 + 1.0 + 1.04))  # the middle step: a plain one


def test_capping_pays_where_long_forwards_are_expensive():
    """t(1..8) = 1, 1.5, 3, 6 s: a step of 3 drafts accepting 1 pays 3 s for 2 tokens, capped at 1 draft 1.5 s."""
    run = [record(1, turn([2, 2, 4], [3, 3, 3], prefill=2.0))]
    bounds = speedup_bounds(run, profile([1.0, 1.5, 3.0, 6.0]))
    vanilla = 2.0 + 8
    # k=0: 8 plain; k=1: 1.5 + 1.5 + (1.5 + 2 plain); k=2: t(3) = 2.25 twice + (2.25 + 1 plain); k=3: 3 x t(4) = 3
    assert bounds.by_k == pytest.approx([1.0, vanilla / 8.5, vanilla / 9.75, vanilla / 11.0])
    assert bounds.replayed == pytest.approx(vanilla / 11.0)
    assert (bounds.best_fixed_k, bounds.best_fixed_k_speedup) == (1, pytest.approx(vanilla / 8.5))
    assert bounds.oracle == pytest.approx(vanilla / (2.0 + 1.5 + 1.5 + 3.0))  # the last step keeps all its 3 drafts


def test_auxiliary_inputs_tree_points_and_records_without_drafted_tokens():
    """A tree step verifying 6 inputs, 3 tokens accepted: as 3 drafts beside 2 auxiliary inputs (Lookahead) every
    cap still carries the 2; without `drafted_tokens` all 5 count as drafts (verified - 1) and can be capped."""
    tree_profile = profile([1.0, 2.0, 3.0, 5.0], tree=[1.25, 2.25, 3.25, 5.25])  # chain t(3, 5, 6) = 2.5, 3.5, 4
    vanilla = 1.0 + 3
    with_aux = speedup_bounds([record(1, turn([3], [3], aux=[2], trees=[True]))], tree_profile)
    assert with_aux.replayed == pytest.approx(vanilla / (1.0 + 4.25))  # tree t(6)
    # k=0: tree t(3) + 2 plain; k=1: tree t(4) + 1 plain; k=2: tree t(5); k=3: tree t(6)
    assert with_aux.by_k == pytest.approx([vanilla / 5.75, vanilla / 5.25, vanilla / 4.75, vanilla / 5.25])
    assert with_aux.best_fixed_k == 2 and with_aux.oracle == pytest.approx(1.0)  # nothing beats 3 plain steps
    plain_record = record(1, turn([3], [3], aux=[2], trees=[True]))
    del plain_record["choices"][0]["drafted_tokens"]
    fallback = speedup_bounds([plain_record], tree_profile)
    assert fallback == speedup_bounds([record(1, turn([3], [5], trees=[True]))], tree_profile)
    # k=0: the root alone, a chain t(1) + 2 plain; k=1: tree t(2) + 1 plain; k=2: tree t(3); k=3..5: t(4..6)
    assert fallback.by_k == pytest.approx([1.0, vanilla / 4.25, vanilla / 3.75, vanilla / 4.25, vanilla / 4.75,
                                           vanilla / 5.25])
    assert (fallback.best_fixed_k, fallback.oracle) == (2, pytest.approx(vanilla / 3.75))


def test_oracle_combine_takes_either_runs_step_at_each_position():
    """Run a accepts 3 tokens at its first step, run b at its last: combined, two forwards make all 6 tokens."""
    one_second = profile([1.0, 1.0, 1.0, 1.0])
    run_a = [record(7, turn([3, 1, 1, 1], [2, 2, 2, 2], draft=0.4))]  # 0.05 s a draft
    run_b = [record(7, turn([1, 1, 1, 3], [1, 1, 1, 2], draft=0.8, prefill=2.0))]  # 0.1 s a draft
    assert speedup_bounds(run_a, one_second).oracle == pytest.approx(7 / (1.0 + 1.1 + 3))
    assert speedup_bounds(run_b, one_second).oracle == pytest.approx(8 / (2.0 + 3 + 1.2))
    assert oracle_combine(run_a, run_b, one_second) == pytest.approx(7 / (1.0 + 1.1 + 1.2))  # a's prefill
    assert oracle_combine(run_b, run_a, one_second) == pytest.approx(8 / (2.0 + 1.1 + 1.2))  # b's
    with pytest.raises(ValueError, match="lacks questions \\[7\\]"):
        oracle_combine(run_a, [record(8, turn([1], [0]))], one_second)
    with pytest.raises(ValueError, match="not the same answers"):
        oracle_combine(run_a, [record(7, turn([1, 1, 1, 2], [1, 1, 1, 2]))], one_second)


def random_profile(rng: np.random.Generator) -> Profile:
    lengths, contexts = [1, 2, 4, 8, 16], [0, 64, 512]
    seconds = np.cumsum(rng.uniform(0.01, 1.0, (len(contexts), len(lengths))), axis=1)
    seconds += np.linspace(0, 0.5, len(contexts))[:, None]  # longer contexts, slower forwards
    return Profile({}, lengths, contexts, seconds.tolist(),
                   tree_seconds=(seconds + rng.uniform(0, 0.3, seconds.shape)).tolist())


def random_turn(rng: np.random.Generator, new_tokens: int, prompt: int) -> dict:
    accepts, left = [], new_tokens - 1
    while left:
        accepts.append(int(rng.integers(1, min(left, 6) + 1)))
        left -= accepts[-1]
    drafted = [int(a - 1 + rng.integers(0, 4)) for a in accepts]
    aux = [int(rng.integers(0, 3)) if rng.random() < 0.3 else 0 for _ in accepts]
    trees = [bool(d + x and rng.random() < 0.5) for d, x in zip(drafted, aux)]  # a root alone is a chain step
    prefill, draft = float(rng.uniform(0.1, 2)), float(rng.uniform(0, 3))
    return turn(accepts, drafted, aux, trees, prompt, prefill=prefill, draft=draft)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_bound_holds_the_one_before(seed):
    """Each option set holds the one before: combine >= oracle >= best fixed k >= replayed, and the largest cap
    replays the run (predicted_speedup), on random runs of two methods over the same answers."""
    rng = np.random.default_rng(seed)
    shapes = [[(int(rng.integers(1, 40)), int(rng.integers(1, 600))) for _ in range(rng.integers(1, 3))]
              for _ in range(5)]  # per question, per turn: new tokens, prompt tokens
    run_a, run_b = ([record(q, *(random_turn(rng, n, p) for n, p in turns)) for q, turns in enumerate(shapes)]
                    for _ in range(2))
    costs = random_profile(rng)
    a, b = speedup_bounds(run_a, costs), speedup_bounds(run_b, costs)
    for bounds, combined in ((a, oracle_combine(run_a, run_b, costs)), (b, oracle_combine(run_b, run_a, costs))):
        assert bounds.by_k[-1] == pytest.approx(bounds.replayed, rel=1e-9)
        tolerance = 1e-12 * bounds.replayed
        assert combined >= bounds.oracle - tolerance
        assert bounds.oracle >= bounds.best_fixed_k_speedup - tolerance
        assert bounds.best_fixed_k_speedup >= bounds.replayed - tolerance
    assert a.replayed == predicted_speedup(run_a, costs)


def test_report_columns_are_nan_without_profile_or_step_data_and_in_the_summary():
    run = [record(1, turn([2, 2, 4], [3, 3, 3], prefill=2.0))]
    costs = profile([1.0, 1.5, 3.0, 6.0])
    assert bounds_row(run, costs) == {"best_fixed_k": 1, "best_fixed_k_speedup": pytest.approx(10 / 8.5),
                                      "oracle_speedup": pytest.approx(10 / 8)}
    old = record(1, turn([2], [1]))
    del old["choices"][0]["verified_tokens"]
    for row in (bounds_row(run, None), bounds_row([old], costs)):
        assert all(math.isnan(v) for v in row.values())
    overall = summarize("m", run, {}, profile=costs).set_index("task").loc["overall"]
    assert (overall.best_fixed_k, overall.best_fixed_k_speedup) == (1, pytest.approx(10 / 8.5))
    assert overall.oracle_speedup == pytest.approx(10 / 8) and overall.predicted_speedup == pytest.approx(10 / 11)
