"""Bad values are refused at start, one line each (exit status 2 from the CLI); prompts too long for the model's
context window are skipped and recorded per question."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.errors import ConfigError
from bench.measure.run import run
from bench.records import read_jsonl
from bench.validate import validate


def test_defaults_are_valid():
    validate(compose_config())
    validate(compose_config("device=cuda:1", "gen.temperature=0.7", "gen.top_p=0.9", "gen.top_k=50", "task.limit=null"))


@pytest.mark.parametrize("override, line", [
    ("gen.temperature=-1", "gen.temperature=-1: must be a number >= 0 (0 = greedy)"),
    ("gen.top_p=0", "gen.top_p=0: must be a number in (0, 1] (1 = no top-p filter)"),
    ("gen.top_p=1.5", "gen.top_p=1.5: must be a number in (0, 1] (1 = no top-p filter)"),
    ("gen.top_k=-1", "gen.top_k=-1: must be an integer >= 0 (0 = no top-k filter)"),
    ("gen.max_new_tokens=0", "gen.max_new_tokens=0: must be an integer >= 1"),
    ("gen.max_new_tokens=ten", "gen.max_new_tokens=ten: must be an integer >= 1"),
    ("task.limit=-3", "task.limit=-3: must be an integer >= 1, or null for every question"),
    ("repeats=0", "repeats=0: must be an integer >= 1"),
    ("model.dtype=float8", "model.dtype=float8: must be one of float32, bfloat16, float16, float64"),
    ("device=tpu", "device=tpu: must be auto, cpu, cuda, cuda:N or mps"),
    ("model.prompt_format=chatml", "model.prompt_format=chatml: must be one of auto, plain, raw"),
])
def test_each_bad_value_gets_its_line(override, line):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(override))
    assert str(error.value) == line


def test_cli_prints_one_line_per_bad_value_and_exits_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench", "gen.temperature=-1", "gen.max_new_tokens=0",
                             "task.limit=-3", f"out_dir={tmp_path}"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: gen.temperature=-1: must be a number >= 0 (0 = greedy)",
                                          "error: gen.max_new_tokens=0: must be an integer >= 1",
                                          "error: task.limit=-3: must be an integer >= 1, or null for every question"]


def test_prompts_too_long_for_the_context_window_are_skipped_and_recorded(compose, base_checkpoint, tmp_path):
    """The base checkpoint's window is 512 tokens: a summarization prompt (a news article) does not fit."""
    args = ("method=pld", "task=all", "task.tasks=[summarization,qa]", "task.limit=1")
    summary = run(compose(*args, checkpoint=base_checkpoint))
    out = tmp_path / "run"
    [skipped] = read_jsonl(out / "skipped.jsonl")
    assert skipped["category"] == "summarization"
    assert skipped["skipped"].startswith("turn 1: prompt of ") and "> the model's context window of 512 tokens" in \
        skipped["skipped"]
    assert [a["category"] for a in read_jsonl(out / "answers.jsonl")] == ["qa"]
    assert list(summary.task) == ["qa", "overall"]
    assert json.loads((out / "meta.json").read_text())["skipped_questions"] == [skipped["question_id"]]
    assert run(compose(*args, checkpoint=base_checkpoint)) is not None  # a rerun neither retries nor repeats it
    assert len(read_jsonl(out / "skipped.jsonl")) == 1 and len(read_jsonl(out / "answers.jsonl")) == 1
