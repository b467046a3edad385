"""Answer records: the current format, format-1 records read in it, and the tool that rewrites old files."""
from __future__ import annotations

import json
import os

import pytest

from bench.migrate_answers import main as migrate
from bench.records import RECORD_FORMAT, AnswerFile, FolderInUseError, in_current_format, parse_records, writing_folder

OLD = {"question_id": 1, "run_key": "k", "choices": [{"new_tokens": [7, 5, 0], "decoding_steps": [3, 2, None],
                                                      "accept_lengths": [1, 4, 2, 1, 4]}]}


def test_format_1_records_are_read_without_their_prefill_steps():
    current = in_current_format(OLD)
    assert current["format"] == RECORD_FORMAT and OLD.get("format") is None
    assert current["choices"][0]["decoding_steps"] == [2, 1, None]
    assert current["choices"][0]["accept_lengths"] == [4, 2, 4]
    assert [r for _, r in parse_records(json.dumps(OLD) + "\n")] == [current]
    assert in_current_format(current) is current
    unreported = {"choices": [{"new_tokens": [9], "decoding_steps": [6], "accept_lengths": []}]}
    assert in_current_format(unreported)["choices"][0] == {"new_tokens": [9], "decoding_steps": [5],
                                                           "accept_lengths": []}
    with pytest.raises(ValueError, match="question 3: format-1 accept_lengths \\(2\\) do not match"):
        in_current_format({"question_id": 3, "choices": [{"decoding_steps": [3], "accept_lengths": [1, 2]}]})


def test_a_resumed_answer_file_holds_its_old_lines_in_the_current_format(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps(OLD) + "\n")
    assert AnswerFile(path, "k", strict=True).records[1]["choices"][0]["accept_lengths"] == [4, 2, 4]


def test_migrate_answers_rewrites_old_lines_and_leaves_current_files_alone(tmp_path, capsys):
    old, current = tmp_path / "runs" / "a" / "answers.jsonl", tmp_path / "runs" / "b" / "answers.jsonl"
    for path in (old, current):
        path.parent.mkdir(parents=True)
    old.write_text(json.dumps(OLD) + "\n" + '{"question_id": 2, "cut off')
    current.write_text(json.dumps(in_current_format(OLD)) + "\n")
    before = current.stat().st_mtime_ns
    migrate([str(tmp_path / "runs")])
    lines = old.read_text().splitlines()
    assert json.loads(lines[0]) == in_current_format(OLD) and lines[1] == '{"question_id": 2, "cut off'
    assert current.stat().st_mtime_ns == before
    assert capsys.readouterr().out.splitlines() == [f"{old}: 1 record(s) rewritten in format {RECORD_FORMAT}",
                                                    "migrate_answers: 2 file(s) checked"]


def test_a_run_folder_has_one_writer_at_a_time(tmp_path):
    """A second run on a folder being written (a resubmitted sweep beside its old job) is refused in one line naming
    the writer's pid; once the first ends, the folder is free again."""
    folder = tmp_path / "run"
    with writing_folder(folder):
        refusal = rf"^{folder} is being written by another run \(pid {os.getpid()}\): wait for it to end \(squeue, "
        with pytest.raises(FolderInUseError, match=refusal + r"for a sweep\) or pass another out_dir=\.\.\.$"):
            with writing_folder(folder):
                pass
    with writing_folder(folder):
        assert (folder / ".lock").read_text() == str(os.getpid())
