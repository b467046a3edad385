"""The protocol (bench/measure/protocol.py) with a scripted backend, no model: which side answers first in each
group, resuming, skipped prompts, exact_match, and the files it writes."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from bench.measure.decoding import PromptTooLong
from bench.measure.protocol import BASELINE, METHOD, Backend, InterleavedRun, KeyInputs, run_keys
from bench.records import config_key, read_jsonl
from bench.settings import Bootstrap, Generation, MethodSettings, ModelSettings, RunSettings, TaskSettings

QUESTIONS = [{"question_id": i, "category": "writing", "turns": [f"question {i}"]} for i in range(1, 6)]


class ScriptedBackend(Backend):
    """Answers every turn with three tokens (the method's differ from the baseline's on `diverging` questions) and
    logs each call; `too_long` questions raise PromptTooLong on `too_long_side`."""

    label, method_is_baseline, group_size, group_column = "scripted", False, 2, "batch_size"
    key_inputs = KeyInputs({"model": "m"}, method={"method": "scripted"})

    def __init__(self, diverging=(), too_long=(), too_long_side=BASELINE):
        self.calls, self.diverging, self.too_long, self.too_long_side = [], set(diverging), set(too_long), too_long_side

    def warm_up(self, side, todo):
        self.calls.append(("warm_up", side))

    def answer(self, side, group, seeds):
        self.calls.append((side, [q["question_id"] for q in group], seeds))
        return [PromptTooLong("too long") if q["question_id"] in self.too_long and side == self.too_long_side else
                [self.turn([1, 2, 4] if side == METHOD and q["question_id"] in self.diverging else [1, 2, 3])]
                for q in group]

    @staticmethod
    def turn(ids):
        return {"text": "a b c", "token_ids": ids, "decode_steps": 1, "wall_time": 0.5, "accept_lengths": [2]}

    def divergence(self, turns, baseline):
        return {"turn": 0, "position": 2, "numeric_tie": False}

    def provenance(self, started):
        return {"config": {}, "started": started}

    def heading(self):
        return "scripted"

    def closing_columns(self, summary):
        return ["task", "n_questions", "speedup", "exact_match"]


@pytest.fixture
def settings(tmp_path):
    return RunSettings(Generation(max_new_tokens=3), ModelSettings("m", "float32"), TaskSettings("writing"),
                       MethodSettings("scripted"), out_dir=str(tmp_path / "run"), baseline=True, warmup_tokens=4,
                       seed=10, starvation_threshold=0.75, bootstrap=Bootstrap(samples=10, seed=0))


def test_the_baseline_goes_first_every_other_group_and_a_resume_answers_nothing(settings, tmp_path):
    backend = ScriptedBackend()
    summary = InterleavedRun(settings, backend, started=1.0).run(QUESTIONS)
    assert backend.calls == [("warm_up", METHOD), ("warm_up", BASELINE),
                             (BASELINE, [1, 2], [11, 12]), (METHOD, [1, 2], [11, 12]),
                             (METHOD, [3, 4], [13, 14]), (BASELINE, [3, 4], [13, 14]),
                             (BASELINE, [5], [15]), (METHOD, [5], [15])]
    again = ScriptedBackend()
    resumed = InterleavedRun(settings, again, started=2.0).run(QUESTIONS)
    assert [c for c in again.calls if c[0] != "warm_up"] == []
    pd.testing.assert_frame_equal(resumed, summary)
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    baselines = read_jsonl(tmp_path / "run" / "baseline.jsonl")
    assert [r["question_id"] for r in answers] == [1, 2, 3, 4, 5]
    assert [r["method"] for r in baselines] == ["vanilla"] * 5
    baseline_key, method_key = run_keys(ScriptedBackend.key_inputs)
    assert (baseline_key, method_key) == (config_key(model="m"), config_key(model="m", method="scripted"))
    assert {r["run_key"] for r in answers} == {method_key} and {r["run_key"] for r in baselines} == {baseline_key}
    assert list(pd.read_csv(tmp_path / "run" / "summary.csv").columns[:3]) == ["method", "task", "batch_size"]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta == {"config": {}, "started": 2.0, "run_key": method_key, "baseline_run_key": baseline_key,
                    "skipped_questions": [], "start_warnings": [], "profile": None, "profile_origin": None,
                    "cpu_share": None, "starved": None}


def test_exact_match_and_divergence_against_the_baseline_null_when_sampling(settings, tmp_path):
    InterleavedRun(settings, ScriptedBackend(diverging={2}), started=1.0).run(QUESTIONS[:2])
    records = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert [(r["exact_match"], r["divergence"]) for r in records] == [
        (True, None), (False, {"turn": 0, "position": 2, "numeric_tie": False})]
    sampled = Generation(max_new_tokens=3, temperature=0.7)
    settings = replace(settings, generation=sampled, out_dir=str(tmp_path / "sampled"))
    InterleavedRun(settings, ScriptedBackend(diverging={2}), started=1.0).run(QUESTIONS[:2])
    records = read_jsonl(tmp_path / "sampled" / "answers.jsonl")
    assert [(r["exact_match"], r["divergence"]) for r in records] == [(None, None), (None, None)]


@pytest.mark.parametrize("side", [METHOD, BASELINE])
def test_a_prompt_too_long_on_either_side_skips_the_question_once(settings, tmp_path, capsys, side):
    InterleavedRun(settings, ScriptedBackend(too_long={3}, too_long_side=side), started=1.0).run(QUESTIONS)
    run_dir = tmp_path / "run"
    assert [r["question_id"] for r in read_jsonl(run_dir / "answers.jsonl")] == [1, 2, 4, 5]
    assert [(r["question_id"], r["skipped"]) for r in read_jsonl(run_dir / "skipped.jsonl")] == [(3, "too long")]
    assert json.loads((run_dir / "meta.json").read_text())["skipped_questions"] == [3]
    assert "skipped 1 question(s) whose prompt + gen.max_new_tokens exceed" in capsys.readouterr().out
    again = ScriptedBackend(too_long={3}, too_long_side=side)
    InterleavedRun(settings, again, started=2.0).run(QUESTIONS)
    assert [c for c in again.calls if c[0] != "warm_up"] == []


def test_without_a_baseline_only_the_method_answers(settings, tmp_path):
    settings = replace(settings, baseline=False)
    backend = ScriptedBackend()
    InterleavedRun(settings, backend, started=1.0).run(QUESTIONS[:3])
    assert [c[0] for c in backend.calls] == ["warm_up", METHOD, METHOD]
    assert not (tmp_path / "run" / "baseline.jsonl").exists()
    assert [r.get("exact_match") for r in read_jsonl(tmp_path / "run" / "answers.jsonl")] == [None, None, None]
