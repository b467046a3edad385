"""Bad inputs are refused in one line before any model work (exit status 2 from the CLI): a task file with a
malformed or incomplete line, an absurd batch size, an attention implementation that ignores tree masks; a batch
larger than the task's questions is cut to them, warm-up included."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bench.measure.run
from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.engine.batched import BatchedEngine
from bench.errors import ConfigError
from bench.measure.run import run
from bench.records import read_jsonl
from bench.validate import validate
from tasks import QUESTIONS_FILE, load_questions
from tests.conftest import tiny_overrides

GOOD_LINES = QUESTIONS_FILE.read_text().splitlines()[:2]  # questions 81 and 82


def task_file(tmp_path, *lines: str, name: str = "questions.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def load(path) -> list[dict]:
    return load_questions(compose_config("task=all", f"task.source.data_files={path}").task)


@pytest.mark.parametrize("override, line", [
    ("gen.batch_size=100000", "gen.batch_size=100000: must be an integer >= 1, at most 1024 (a batch larger than the "
                              "task's questions is cut to them)"),
    ("gen.batch_size=0", "gen.batch_size=0: must be an integer >= 1, at most 1024 (a batch larger than the task's "
                         "questions is cut to them)"),
    ("model.attn_implementation=flash_attention_2",
     "model.attn_implementation=flash_attention_2: must be sdpa or eager (flash attention ignores the 4-D tree masks "
     "verification needs)"),
])
def test_bad_values_get_one_line(override, line):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(override))
    assert str(error.value) == line


def test_sdpa_and_eager_and_the_largest_batch_pass():
    for override in ("model.attn_implementation=sdpa", "model.attn_implementation=eager", "gen.batch_size=1024"):
        validate(compose_config(override))


def test_a_good_custom_task_file_loads(tmp_path):
    questions = load(task_file(tmp_path, GOOD_LINES[0], "", GOOD_LINES[1]))  # blank lines are fine
    assert [q["question_id"] for q in questions] == [81, 82] and questions[0]["category"] == "writing"


@pytest.mark.parametrize("bad_line, problem", [
    ('{"question_id": 99, "category": "writing", "turns": ["x"', "not valid JSON (Expecting ',' delimiter, column 57)"),
    ('{"question_id": 99, "category": "writing"}', "no 'turns' (every question needs question_id (an integer), "
                                                   "category (a string) and turns (a list of strings))"),
    ('{"question_id": "99", "category": "writing", "turns": ["x"]}', "question_id '99' is not an integer"),
    ('{"question_id": 99, "category": "writing", "turns": "x"}', "turns must be a non-empty list of strings, not x"),
    ('{"question_id": 99, "category": "writing", "turns": []}', "turns must be a non-empty list of strings, not []"),
    ('[1, 2]', "a JSON object with question_id (an integer), category (a string) and turns (a list of strings) "
               "expected, not list"),
    (GOOD_LINES[0], "question_id 81 repeats line 1's (ids must be unique)"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, bad_line, problem):
    path = task_file(tmp_path, GOOD_LINES[0], bad_line, GOOD_LINES[1])
    with pytest.raises(ConfigError) as error:
        load(path)
    message = str(error.value)
    assert message.startswith(f"task file {path} line 2: {problem}") and "\n" not in message


def test_a_json_array_file_is_checked_item_by_item(tmp_path):
    items = [json.loads(GOOD_LINES[0]), {"question_id": 5, "category": "qa"}]
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(items, indent=2))
    with pytest.raises(ConfigError, match=r"questions.json item 1: no 'turns'"):
        load(path)
    path.write_text(json.dumps(items[:1], indent=2)[:-3])  # cut off
    with pytest.raises(ConfigError, match=r"questions.json line \d+: not valid JSON"):
        load(path)


def test_a_missing_task_file_and_an_empty_selection_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=f"task.source.data_files={tmp_path}/nope.jsonl: no such file"):
        load(tmp_path / "nope.jsonl")
    path = task_file(tmp_path, *GOOD_LINES)
    cfg = compose_config("task=all", "task.tasks=[poetry]", f"task.source.data_files={path}")
    with pytest.raises(ConfigError, match=r"task 'all' selected no questions \(tasks=\['poetry'\]"):
        load_questions(cfg.task)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_refuses_a_malformed_task_file_in_one_line_with_status_2(tiny_checkpoint, tmp_path):
    path = task_file(tmp_path, GOOD_LINES[0], '{"question_id": 99, "category": "qa", "turns": ["x"]] }')
    result = _cli(*tiny_overrides(tiny_checkpoint, tmp_path / "run"), "task=all", f"task.source.data_files={path}")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if not line.startswith("WARNING")]  # a busy machine's
    assert lines == [f"error: task file {path} line 2: not valid JSON (Expecting ',' delimiter, column 53): "
                     '{"question_id": 99, "category": "qa", "turns": ["x"]] }']
    assert not (tmp_path / "run" / "answers.jsonl").exists() and not (tmp_path / "run" / "meta.json").exists()


def test_cli_refuses_an_absurd_batch_size_with_status_2(tmp_path):
    result = _cli("gen.batch_size=100000", f"out_dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: gen.batch_size=100000: must be an integer >= 1, at most 1024 (a "
                                          "batch larger than the task's questions is cut to them)"]


def test_a_batch_larger_than_the_questions_is_cut_to_them_warm_up_included(compose, tmp_path, monkeypatch, capsys):
    rows = []
    generate = BatchedEngine.generate

    def counting(self, prompts, stop, seeds):
        rows.append(len(prompts))
        return generate(self, prompts, stop, seeds)

    monkeypatch.setattr(BatchedEngine, "generate", counting)
    summary = run(compose("method=vanilla", "task=qa", "task.limit=2", "gen.batch_size=64"))
    assert rows and max(rows) == 2  # the warm-up too: never 64 rows
    assert len(read_jsonl(tmp_path / "run" / "answers.jsonl")) == 2 and summary.n_questions.tolist() == [2, 2]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: gen.batch_size")]
    assert notes == ["note: gen.batch_size=64 > the 2 question(s) of task 'qa': decoding them 2 at a time"]


def test_the_task_file_is_checked_before_the_model_loads(compose, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(bench.measure.run, "load_model", no_model)
    path = task_file(tmp_path, '{"question_id": 1, "category": "qa"}')
    with pytest.raises(ConfigError, match="line 1: no 'turns'"):
        run(compose("task=all", f"task.source.data_files={path}"))
