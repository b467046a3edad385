"""Spec-Bench's answer files (hemingkx/Spec-Bench: evaluation/eval.py writes data/<bench>/model_answer/<model-id>.jsonl,
the layout our answers.jsonl keeps), scored as its evaluation/speed.py scores a method's file against a baseline's,
per task (MT-bench: its eight categories; `overall`: every line) from each line's choices[0]:

- tok/s: the mean over the task's lines of sum(new_tokens) / sum(wall_time);
- vanilla tok/s: the same over the baseline file's lines of that task, their tokens counted as speed.py counts
  them, len(tokenizer(turn).input_ids) - 1 per turn, with --spec-bench-tokenizer; without it from their new_tokens
  (the generated ids, as our own metrics count them; docs/metrics.md says where the two differ);
- speedup: tok/s / vanilla tok/s (no interval: speed.py pairs whole files, not questions); none without a baseline;
- #MAT: the mean of every accept_lengths entry of the task's lines.

Every line counts, as speed.py reads them (eval.py's reorg_answer_file sorts and dedupes a file). The method is the
lines' model_id (eval.py's --model-id), else the file's name.
"""
from __future__ import annotations

import math
from pathlib import Path

from bench.errors import ConfigError
from bench.report.imports.shared import ImportedRow, json_lines, need, refusal
from tasks import task_of

SOURCE = "spec-bench"
KIND = "a Spec-Bench answer line"
METHOD_FIELDS = ("category", "choices[0].new_tokens", "choices[0].wall_time", "choices[0].accept_lengths")
TEXT_FIELDS = ("category", "choices[0].turns")  # the others are lists of numbers


def answers(path: Path, fields: tuple[str, ...]) -> list[dict]:
    """The file's answer lines, each holding `fields` (lists of numbers, but for category and turns)."""
    lines = json_lines(path, KIND)
    for line, record in lines:
        for name in fields:
            need(record, name, path, KIND, line, number=False if name in TEXT_FIELDS else "list")
        if sum(record["choices"][0]["wall_time"]) <= 0:
            raise refusal(path, "choices[0].wall_time adds up to no time", line)
    return [record for _, record in lines]


def load_tokenizer(name: str):
    """The tokenizer speed.py would re-tokenise the baseline's answers with (its --tokenizer-path)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--spec-bench-tokenizer {name}: no tokenizer there ({str(err).splitlines()[0]})") from None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def rows(path: Path, baseline_path: Path | None, tokenizer=None) -> list[ImportedRow]:
    """A row per task of the method's file and `overall`; speedups over `baseline_path`'s lines, where given."""
    method = answers(path, METHOD_FIELDS)
    counted = "choices[0].turns" if tokenizer is not None else "choices[0].new_tokens"
    baseline = [] if baseline_path is None else answers(baseline_path, ("category", "choices[0].wall_time", counted))

    def baseline_tokens(choice: dict) -> int:
        if tokenizer is None:
            return sum(choice["new_tokens"])
        return sum(len(tokenizer(turn).input_ids) - 1 for turn in choice["turns"])

    name = str(method[0].get("model_id") or path.stem)
    where = str(path) if baseline_path is None else f"{path} (baseline {baseline_path})"
    out = []
    for task in [*dict.fromkeys(task_of(r["category"]) for r in method), "overall"]:
        mine = [r["choices"][0] for r in method if task in ("overall", task_of(r["category"]))]
        theirs = [r["choices"][0] for r in baseline if task in ("overall", task_of(r["category"]))]
        rate = _mean([sum(c["new_tokens"]) / sum(c["wall_time"]) for c in mine])
        baseline_rate = _mean([baseline_tokens(c) / sum(c["wall_time"]) for c in theirs])
        out.append(ImportedRow(SOURCE, where, name, task=task, n_questions=len(mine),
                               new_tokens=sum(sum(c["new_tokens"]) for c in mine), tokens_per_s=rate,
                               baseline_tokens_per_s=baseline_rate,
                               speedup=rate / baseline_rate if baseline_rate > 0 else math.nan,
                               mean_accepted_tokens=_mean([a for c in mine for a in c["accept_lengths"]])))
    return out
