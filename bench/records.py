"""Answer records in Spec-Bench's layout, appended and flushed one question at a time (so runs resume)."""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path


def config_key(**parts) -> str:
    """A short stable hash of whatever decides a run's outputs (model, dtype, prompts, generation settings...)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def answer_record(question: dict, model_id: str, method: str, run_key: str, turns: list[dict]) -> dict:
    """One Spec-Bench answer line; `turns` holds per turn: text, token_ids, steps, wall_time, accept_lengths."""
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "answer_id": uuid.uuid4().hex,
        "model_id": model_id,
        "method": method,
        "run_key": run_key,
        "tstamp": time.time(),
        "choices": [
            {
                "index": 0,
                "turns": [t["text"] for t in turns],
                "decoding_steps": [t["steps"] for t in turns],
                "new_tokens": [len(t["token_ids"]) for t in turns],
                "wall_time": [t["wall_time"] for t in turns],
                "accept_lengths": [a for t in turns for a in t["accept_lengths"]],
                "token_ids": [t["token_ids"] for t in turns],
            }
        ],
    }


def parse_records(text: str) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each JSONL line; blank lines and a line cut off by an interrupted run are skipped."""
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError:
                continue


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file in file order (none when it does not exist); cut-off lines are skipped."""
    return [record for _, record in parse_records(path.read_text())] if path.exists() else []


class AnswerFile:
    """A JSONL file of answer records; `strict` refuses records written under another run key."""

    def __init__(self, path: Path, run_key: str, strict: bool):
        self.path, self.run_key = path, run_key
        self.records: dict[int, dict] = {}
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):  # finish a line cut off by an interrupted run
                with path.open("a") as f:
                    f.write("\n")
            for line_no, record in parse_records(text):  # a line cut off by an interrupted run: that question is redone
                if record.get("run_key") == run_key:
                    self.records[record["question_id"]] = record
                elif strict:
                    raise ValueError(
                        f"{path} line {line_no} was written by a run with other settings (run_key "
                        f"{record.get('run_key')} != {run_key}); pass a fresh out_dir=... or delete that file"
                    )

    def __contains__(self, question_id: int) -> bool:
        return question_id in self.records

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        self.records[record["question_id"]] = record
