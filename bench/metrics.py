"""The harness's metrics, defined once (README explains them):

- tokens/s of a question = its new tokens / its generation wall time (all turns), Spec-Bench's definition;
  a task's tokens/s is the mean over its questions; speedup = method tokens/s / vanilla tokens/s on the same questions.
- mean accepted tokens = new tokens / target forwards (prefill included, bonus token counted; vanilla = 1.00).
- accept_rate_posK = fraction of decode steps (after prefill) that accepted at least K drafted tokens.
- exact_match = fraction of questions whose greedy token ids equal vanilla's (NaN when sampling).
Token counts come from generated ids, never from re-tokenised text.
"""
from __future__ import annotations

import math

import pandas as pd

from tasks import task_of

ACCEPT_POSITIONS = 5


def tokens_per_second(record: dict) -> float:
    choice = record["choices"][0]
    return sum(choice["new_tokens"]) / max(sum(choice["wall_time"]), 1e-9)


def decode_step_accepts(record: dict) -> list[int]:
    """Accepted draft tokens per decode step, leaving out each turn's prefill step."""
    choice = record["choices"][0]
    accepts, start = [], 0
    for steps in choice["decoding_steps"]:
        accepts += [a - 1 for a in choice["accept_lengths"][start + 1 : start + steps]]
        start += steps
    return accepts


def _row(method: str, task: str, records: list[dict], baselines: dict[int, dict]) -> dict:
    new_tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in records)
    steps = sum(sum(r["choices"][0]["decoding_steps"]) for r in records)
    speed = sum(tokens_per_second(r) for r in records) / len(records)
    paired = [baselines[r["question_id"]] for r in records if r["question_id"] in baselines]
    base_speed = sum(tokens_per_second(b) for b in paired) / len(paired) if paired else math.nan
    matches = [r["exact_match"] for r in records if r.get("exact_match") is not None]
    divergences = [r["divergence"] for r in records if r.get("divergence")]
    accepts = [a for r in records for a in decode_step_accepts(r)]
    row = {
        "method": method,
        "task": task,
        "n_questions": len(records),
        "new_tokens": new_tokens,
        "tokens_per_s": speed,
        "baseline_tokens_per_s": base_speed,
        "speedup": speed / base_speed if paired else math.nan,
        "mean_accepted_tokens": new_tokens / steps,
        "exact_match": sum(matches) / len(matches) if matches else math.nan,
        "numeric_ties": sum(bool(d.get("numeric_tie")) for d in divergences),
    }
    for k in range(1, ACCEPT_POSITIONS + 1):
        row[f"accept_rate_pos{k}"] = sum(a >= k for a in accepts) / len(accepts) if accepts else math.nan
    return row


def summarize(method: str, records: list[dict], baselines: dict[int, dict]) -> pd.DataFrame:
    """One row per task present in `records`, plus `overall`. `baselines` maps question_id to vanilla's record."""
    by_task: dict[str, list[dict]] = {}
    for record in records:
        by_task.setdefault(task_of(record["category"]), []).append(record)
    rows = [_row(method, task, rs, baselines) for task, rs in by_task.items()]
    rows.append(_row(method, "overall", records, baselines))
    return pd.DataFrame(rows)
