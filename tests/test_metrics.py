"""The summary metrics computed from hand-built records."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.engine.drafter import Drafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.tree import DraftTree
from bench.measure.metrics import mean_accepted_tokens, summarize
from bench.records import RECORD_FORMAT, answer_record
from tests.conftest import VOCAB, vanilla_tokens


def record(qid, category, new_tokens, wall_time, steps, accept_lengths, exact=True, divergence=None):
    return {"question_id": qid, "category": category, "exact_match": exact, "divergence": divergence,
            "choices": [{"new_tokens": new_tokens, "wall_time": wall_time, "decoding_steps": steps,
                         "accept_lengths": accept_lengths}]}


def test_speedup_accepted_tokens_and_position_rates():
    method = [
        # two turns, each the prefill's token then decode steps accepting 3, 1 drafts (+1 the target's own each), 3
        record(1, "writing", [7, 5], [1.0, 1.0], [2, 1], [4, 2, 4], exact=True),
        record(2, "qa", [10], [2.0], [3], [3, 3, 3], exact=False,
               divergence={"position": 4, "numeric_tie": True}),
    ]
    vanilla = {1: record(1, "writing", [7, 5], [3.0, 3.0], [6, 4], [1] * 10),
               2: record(2, "qa", [10], [5.0], [9], [1] * 9)}
    table = summarize("m", method, vanilla).set_index("task")
    assert list(table.index) == ["mt_bench", "qa", "overall"]
    assert table.loc["mt_bench", "tokens_per_s"] == pytest.approx(6.0)
    assert table.loc["mt_bench", "speedup"] == pytest.approx(6.0 / 2.0)
    assert table.loc["overall", "tokens_per_s"] == pytest.approx((6.0 + 5.0) / 2)
    assert table.loc["overall", "speedup"] == pytest.approx((6.0 + 5.0) / (2.0 + 2.0))
    assert table.loc["mt_bench", "mean_accepted_tokens"] == pytest.approx(10 / 3)  # the prefills' tokens left out
    assert table.loc["overall", "mean_accepted_tokens"] == pytest.approx(19 / 6)
    # decode steps accepted 3, 1, 3 drafts (q1) and 2, 2, 2 (q2)
    assert table.loc["overall", "accept_rate_pos1"] == pytest.approx(6 / 6)
    assert table.loc["overall", "accept_rate_pos2"] == pytest.approx(5 / 6)
    assert table.loc["overall", "accept_rate_pos3"] == pytest.approx(2 / 6)
    assert table.loc["overall", "accept_rate_pos4"] == 0
    assert table.loc["overall", "exact_match"] == 0.5 and table.loc["overall", "numeric_ties"] == 1


def test_sampling_runs_have_no_exact_match_and_missing_baseline_no_speedup():
    table = summarize("m", [record(1, "rag", [4], [1.0], [1], [3], exact=None)], {})
    assert math.isnan(table.exact_match[0]) and math.isnan(table.speedup[0])


def paired_records(factors: list[float]) -> tuple[list[dict], dict[int, dict]]:
    """Questions whose method ran factors[i] times faster than vanilla (10 tokens in 1 s)."""
    method = [record(i, "qa", [10], [1.0 / f], [3], [3, 3, 3]) for i, f in enumerate(factors)]
    return method, {i: record(i, "qa", [10], [1.0], [9], [1] * 9) for i in range(len(factors))}


def test_speedup_interval_is_reproducible_with_a_seed_and_contains_the_estimate():
    method, vanilla = paired_records([1.1, 1.6, 0.9, 1.3, 2.0, 1.2, 1.4, 0.8])
    row = summarize("m", method, vanilla, ci_seed=3).iloc[-1]
    assert row.speedup_ci_low < row.speedup < row.speedup_ci_high
    again = summarize("m", method, vanilla, ci_seed=3).iloc[-1]
    assert (again.speedup_ci_low, again.speedup_ci_high) == (row.speedup_ci_low, row.speedup_ci_high)
    other = summarize("m", method, vanilla, ci_seed=4).iloc[-1]
    assert (other.speedup_ci_low, other.speedup_ci_high) != (row.speedup_ci_low, row.speedup_ci_high)
    assert other.speedup_ci_low == pytest.approx(row.speedup_ci_low, rel=0.05)  # 2000 resamples: seeds agree closely


def test_speedup_interval_resamples_questions_in_pairs():
    # every question 1.5x faster than its own vanilla, at very different speeds: pairs keep the ratio exactly 1.5
    method = [record(i, "qa", [10], [t / 1.5], [3], [3, 3, 3]) for i, t in enumerate([0.1, 1.0, 10.0])]
    vanilla = {i: record(i, "qa", [10], [t], [9], [1] * 9) for i, t in enumerate([0.1, 1.0, 10.0])}
    row = summarize("m", method, vanilla).iloc[-1]
    assert row.speedup_ci_low == pytest.approx(1.5) and row.speedup_ci_high == pytest.approx(1.5)


def test_no_interval_from_one_question_or_without_resamples():
    method, vanilla = paired_records([1.5, 1.2])
    one = summarize("m", method[:1], vanilla).iloc[-1]
    assert math.isnan(one.speedup_ci_low) and math.isnan(one.speedup_ci_high) and one.speedup == pytest.approx(1.5)
    assert math.isnan(summarize("m", method, vanilla, ci_samples=0).iloc[-1].speedup_ci_low)


class TwoRightDrafter(Drafter):
    """Proposes the next three tokens of a known continuation, the third wrong: 2 accepted drafts a step."""

    def __init__(self, reference: list[int], prompt_len: int):
        self.reference, self.prompt_len = reference, prompt_len

    def start(self, prompt_ids):
        pass

    def propose(self, context, max_tokens):
        truth = self.reference[len(context) - self.prompt_len:][:3]
        return DraftTree.chain(truth[:2] + [(t + 1) % VOCAB for t in truth[2:]])

    def update(self, step):
        pass


def engine_record(model, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """The answer line bench.records writes for one question whose turns decode `prompts` with TwoRightDrafter."""
    turns = []
    for prompt in prompts:
        drafter = TwoRightDrafter(vanilla_tokens(model, prompt, max_new_tokens), len(prompt))
        out = SpeculativeEngine(model, drafter).generate(prompt, StopCondition(max_new_tokens))
        turns.append({"text": "", "token_ids": out.tokens, "decode_steps": out.decode_steps, "wall_time": 1.0,
                      "accept_lengths": out.accept_lengths})
    question = {"question_id": 1, "category": "writing"}
    return json.loads(json.dumps(answer_record(question, "m", "two-right", "key", turns)))


def test_mean_accepted_tokens_is_spec_bench_mean_of_accept_lengths_on_records_we_write(tiny_model, prompts):
    record = engine_record(tiny_model, prompts[:2], 11)
    choice = record["choices"][0]
    assert record["format"] == RECORD_FORMAT and choice["new_tokens"] == [11, 11]
    assert choice["decoding_steps"] == [4, 4] and choice["accept_lengths"] == [3, 3, 3, 1] * 2  # the last step cut
    spec_bench = np.mean(choice["accept_lengths"])  # Spec-Bench's evaluation/speed.py: np.mean(accept_lengths_list)
    assert mean_accepted_tokens([record]) == spec_bench == 2.5
    assert summarize("m", [record], {}).set_index("task").loc["overall", "mean_accepted_tokens"] == spec_bench


def test_mean_accepted_tokens_from_steps_alone_and_nan_without_steps():
    counted = record(1, "qa", [10, 4], [1.0, 1.0], [4, 1], [])  # a server that reports steps, not their lengths
    assert mean_accepted_tokens([counted]) == pytest.approx((9 + 3) / 5)
    assert math.isnan(mean_accepted_tokens([record(1, "qa", [10], [1.0], [None], [])]))
    assert math.isnan(mean_accepted_tokens([record(1, "qa", [1], [1.0], [0], [])]))  # only the prefill's token
