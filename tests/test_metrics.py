"""The summary metrics computed from hand-built records."""
from __future__ import annotations

import math

import pytest

from bench.metrics import summarize


def record(qid, category, new_tokens, wall_time, steps, accept_lengths, exact=True, divergence=None):
    return {"question_id": qid, "category": category, "exact_match": exact, "divergence": divergence,
            "choices": [{"new_tokens": new_tokens, "wall_time": wall_time, "decoding_steps": steps,
                         "accept_lengths": accept_lengths}]}


def test_speedup_accepted_tokens_and_position_rates():
    method = [
        # two turns: prefill steps (1) then decode steps accepting 3, 1, 2 (+1 bonus each) and 4
        record(1, "writing", [7, 5], [1.0, 1.0], [3, 2], [1, 4, 2, 1, 4], exact=True),
        record(2, "qa", [10], [2.0], [4], [1, 3, 3, 3], exact=False,
               divergence={"position": 4, "numeric_tie": True}),
    ]
    vanilla = {1: record(1, "writing", [7, 5], [3.0, 3.0], [7, 5], [1] * 12),
               2: record(2, "qa", [10], [5.0], [10], [1] * 10)}
    table = summarize("m", method, vanilla).set_index("task")
    assert list(table.index) == ["mt_bench", "qa", "overall"]
    assert table.loc["mt_bench", "tokens_per_s"] == pytest.approx(6.0)
    assert table.loc["mt_bench", "speedup"] == pytest.approx(6.0 / 2.0)
    assert table.loc["overall", "tokens_per_s"] == pytest.approx((6.0 + 5.0) / 2)
    assert table.loc["overall", "speedup"] == pytest.approx((6.0 + 5.0) / (2.0 + 2.0))
    assert table.loc["mt_bench", "mean_accepted_tokens"] == pytest.approx(12 / 5)
    assert table.loc["overall", "mean_accepted_tokens"] == pytest.approx(22 / 9)
    # decode steps accepted 3, 1, 3 drafts (q1) and 2, 2, 2 (q2)
    assert table.loc["overall", "accept_rate_pos1"] == pytest.approx(6 / 6)
    assert table.loc["overall", "accept_rate_pos2"] == pytest.approx(5 / 6)
    assert table.loc["overall", "accept_rate_pos3"] == pytest.approx(2 / 6)
    assert table.loc["overall", "accept_rate_pos4"] == 0
    assert table.loc["overall", "exact_match"] == 0.5 and table.loc["overall", "numeric_ties"] == 1


def test_sampling_runs_have_no_exact_match_and_missing_baseline_no_speedup():
    table = summarize("m", [record(1, "rag", [4], [1.0], [2], [1, 3], exact=None)], {})
    assert math.isnan(table.exact_match[0]) and math.isnan(table.speedup[0])
