"""Answer records in Spec-Bench's layout, appended and flushed one question at a time (so runs resume).

A turn's `decoding_steps` counts its decode steps (target forwards after the prefill) and `accept_lengths` holds
the tokens each of them added, as Spec-Bench's runners write them, so #MAT = np.mean(accept_lengths) (Spec-Bench's
evaluation/speed.py) and new_tokens = 1 + the turn's accept_lengths (the prefill's token). Records carry
`"format": RECORD_FORMAT`; records without it (format 1, written before issue 42) counted each turn's prefill as a
step of accept length 1, and are read in the current layout (`in_current_format`); `python -m bench.migrate_answers`
rewrites such files."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.errors import ConfigError

PHASES = ("prefill", "draft", "verify", "accept")  # a turn's phase_times keys (the engine's phases)
TIMING_KEYS = ("wall_times", "cpu_times", "threads", "cores")  # beyond Spec-Bench's layout; no cpu_times on CUDA
# Also beyond it, for the cost model and the acceptance records: seconds per engine phase, tokens per verification
# forward, draft nodes per step (0: nothing drafted), whether it took a tree mask, prompt length; for batched runs
# (gen.batch_size > 1): seconds until the row's last token, rows decoded together
STEP_KEYS = ("phase_times", "verified_tokens", "drafted_tokens", "tree_steps", "prompt_tokens", "latency",
             "batch_rows")
ENERGY_KEYS = ("energy_j",)  # on CUDA with NVML: the device's joules while the turn decoded (its share, batched)
RECORD_FORMAT = 2  # 2: steps and accept_lengths count decode steps only (Spec-Bench's); 1 (no key): prefill included


def config_key(**parts) -> str:
    """A short stable hash of whatever decides a run's outputs (model, dtype, prompts, generation settings...)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def answer_record(question: dict, model_id: str, method: str, run_key: str, turns: list[dict]) -> dict:
    """One Spec-Bench answer line; `turns` holds per turn: text, token_ids, decode_steps, wall_time, accept_lengths
    (per decode step), and where measured the TIMING_KEYS (every repeat's wall and CPU seconds, torch threads,
    available cores) and the STEP_KEYS (the first repeat's seconds per engine phase, its verified tokens per step,
    the prompt's length), and on a GPU the ENERGY_KEYS (joules, median over repeats)."""
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "answer_id": uuid.uuid4().hex,
        "model_id": model_id,
        "method": method,
        "run_key": run_key,
        "tstamp": time.time(),
        "format": RECORD_FORMAT,
        "choices": [
            {
                "index": 0,
                "turns": [t["text"] for t in turns],
                "decoding_steps": [t["decode_steps"] for t in turns],
                "new_tokens": [len(t["token_ids"]) for t in turns],
                "wall_time": [t["wall_time"] for t in turns],
                "accept_lengths": [a for t in turns for a in t["accept_lengths"]],
                "token_ids": [t["token_ids"] for t in turns],
                **{key: [t[key] for t in turns] for key in (*TIMING_KEYS, *STEP_KEYS, *ENERGY_KEYS)
                   if key in turns[0]},
            }
        ],
    }


def in_current_format(record: dict) -> dict:
    """`record` in RECORD_FORMAT: a format-1 record loses each turn's prefill step (its first accept length, one
    step); ValueError when its accept_lengths are neither every step's nor none (no way to tell the turns apart)."""
    if record.get("format", 1) >= RECORD_FORMAT or "choices" not in record:
        return record
    choices = []
    for choice in record["choices"]:
        steps, lengths = choice["decoding_steps"], choice["accept_lengths"]
        known = [s for s in steps if s is not None]
        if lengths and len(lengths) != sum(known):
            raise ValueError(f"question {record.get('question_id')}: format-1 accept_lengths ({len(lengths)}) do not "
                             f"match its decoding_steps ({sum(known)}); cannot drop the prefill steps")
        decode, start = [], 0
        for s in known:
            decode += lengths[start + 1 : start + s]
            start += s
        choices.append({**choice, "decoding_steps": [None if s is None else max(s - 1, 0) for s in steps],
                        "accept_lengths": decode})
    return {**record, "format": RECORD_FORMAT, "choices": choices}


def parse_records(text: str) -> Iterator[tuple[int, dict]]:
    """(line number, record in RECORD_FORMAT) of each JSONL line; blank lines and a line cut off by an interrupted
    run are skipped."""
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield line_no, in_current_format(record)


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file in file order (none when it does not exist); cut-off lines are skipped."""
    return [record for _, record in parse_records(path.read_text())] if path.exists() else []


def set_aside_cut_lines(path: Path) -> str:
    """Move lines that are not JSON (cut off by an interrupted run: their questions are redone) to `<path>.partial`,
    appending, so the file stays valid JSONL for Spec-Bench's scripts; says so once. Returns the clean text."""
    text = path.read_text()
    kept, cut = [], []
    for line in filter(str.strip, text.splitlines()):
        (kept if _is_json(line) else cut).append(line + "\n")
    if not text or (not cut and text.endswith("\n")):
        return text
    if cut:
        partial = path.with_name(path.name + ".partial")
        with partial.open("a") as f:
            f.write("".join(cut))
        print(f"note: moved {len(cut)} cut-off line(s) of {path} (an interrupted run) to {partial}; their questions "
              f"are decoded again", file=sys.stderr)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)
    return "".join(kept)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


class FolderInUseError(RuntimeError):
    """Another process is writing the run folder."""


@contextmanager
def writing_folder(folder: Path) -> Iterator[None]:
    """Hold `folder`'s writer lock (its `.lock` file) while the block runs, so that two runs (a resubmitted sweep
    beside its old jobs, say) never append to one answers file; a second writer is refused at once."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise FolderInUseError(f"{folder} is being written by another run (pid {lock.read().strip() or '?'}): "
                                   f"wait for it to end (squeue, for a sweep) or pass another out_dir=...") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


class AnswerFile:
    """A JSONL file of answer records; `strict` refuses records written under another run key."""

    def __init__(self, path: Path, run_key: str, strict: bool):
        self.path, self.run_key = path, run_key
        self.records: dict[int, dict] = {}
        if path.exists():
            text = set_aside_cut_lines(path)
            for line_no, record in parse_records(text):
                if record.get("run_key") == run_key:
                    self.records[record["question_id"]] = record
                elif strict:
                    raise ConfigError(
                        f"{path} line {line_no} holds an answer made with other weights, datastore or device than "
                        f"this run's, under the same settings (run_key {record.get('run_key')} there, {run_key} here): "
                        f"pass another out_dir=..."
                    )

    def __contains__(self, question_id: int) -> bool:
        return question_id in self.records

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        self.records[record["question_id"]] = record
