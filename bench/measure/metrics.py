"""The harness's metrics, defined once (docs/metrics.md explains them):

- tokens/s of a question = its new tokens / its generation wall time (all turns), Spec-Bench's definition;
  a task's tokens/s is the mean over its questions; speedup = method tokens/s / baseline tokens/s on the same questions
  (the baseline: vanilla decoding, interleaved in the same run).
  At gen.batch_size > 1 a turn's wall time is its share of its batch's (its tokens over the batch's), so a
  question's tokens/s is its batch's throughput (total tokens / batch seconds) and speedup is a throughput ratio
  against the baseline decoded in the same batches.
- mean_latency_s / baseline_mean_latency_s: mean seconds per turn until its last token (at batch 1, its wall time;
  batched, from the batch's start), for the method and its baseline.
- decode steps = a turn's target forwards after its prefill (the records' `decoding_steps`; target forwards =
  decode steps + 1); a decode step's accept length = the tokens it added (accepted drafts + the target's own), the
  records' `accept_lengths` (bench/records.py). The prefill's token is counted in new tokens, not as a step.
- mean accepted tokens (#MAT) = mean accept length over all decode steps = (new tokens - turns) / decode steps, what
  Spec-Bench's evaluation/speed.py prints (np.mean of every accept_lengths entry; vanilla = 1.00); NaN where a turn's
  steps are unknown (decoding_steps null: a serving engine that reports no acceptance).
- accept_rate_posK = fraction of decode steps that accepted at least K drafted tokens.
- exact_match = fraction of questions whose greedy token ids equal the baseline's (NaN when sampling);
  exact_until_divergence = share of the baseline's tokens reproduced before each question's first divergence (1.0 when
  every question matches; after a divergence the texts differ, so the rest measures different text).
- speedup_ci_low / speedup_ci_high = 95% percentile interval of the speedup from a paired bootstrap over questions
  (seeded; NaN under two paired questions). #MAT has none: under greedy decoding it is the same every run.
- cpu_share / starved: bench.measure.contention's starvation check over the method's and its paired baseline's turns.
- prefill_share / draft_share / verify_share / accept_share = the method's seconds in each engine phase over its
  generation wall time (what is left is the timer's own overhead); mean_verified_tokens = tokens per verification
  forward (root + draft nodes + lookahead's window), decode steps only.
- predicted_speedup: what the target's forward-time profile predicts from the run's own steps
  (bench/planning/costmodel.py); model_gap = speedup / predicted_speedup - 1 (negative: slower than the profile
  explains), gap_flagged when the prediction lies outside the speedup's 95% interval: time spent outside drafting
  and the target's forward.
- best_fixed_k / best_fixed_k_speedup / oracle_speedup: bounds on predicted_speedup from the same recorded steps with
  every step capped at the best fixed number of drafts, or each step's drafts cut by an oracle
  (bench/planning/bounds.py); NaN where predicted_speedup is.
- joules_per_token / baseline_joules_per_token: GPU energy (NVML, bench/measure/gpu.py) of the method's / its paired
  baseline's turns over their generated tokens; NaN where no energy was measured (CPU, NVML missing).
Token counts come from generated ids, never from re-tokenised text.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.measure.acceptance import acceptance_aggregates
from bench.measure.contention import DEFAULT_STARVATION_THRESHOLD, cpu_share, is_starved
from bench.planning.bounds import bounds_row
from bench.planning.costmodel import Profile, predicted_speedup
from bench.records import PHASES
from tasks import task_of

ACCEPT_POSITIONS = 5
CI_LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000


def tokens_per_second(record: dict) -> float:
    choice = record["choices"][0]
    return sum(choice["new_tokens"]) / max(sum(choice["wall_time"]), 1e-9)


def mean_latency(records: list[dict]) -> float:
    """Mean seconds per turn from the start of its (batch's) decoding until its last token."""
    choices = [r["choices"][0] for r in records]
    latencies = [s for c in choices for s in c.get("latency", c["wall_time"])]
    return sum(latencies) / len(latencies) if latencies else math.nan


def joules_per_token(records: list[dict]) -> float:
    """Energy over generated tokens, from the turns that have an `energy_j` reading; NaN when none has."""
    joules = tokens = 0
    for record in records:
        choice = record["choices"][0]
        for energy, new_tokens in zip(choice.get("energy_j", ()), choice["new_tokens"]):
            if energy is not None:
                joules, tokens = joules + energy, tokens + new_tokens
    return joules / tokens if tokens else math.nan


def decode_step_accepts(record: dict) -> list[int]:
    """Accepted draft tokens per decode step (a step's accept length less the target's own token)."""
    return [a - 1 for a in record["choices"][0]["accept_lengths"]]


def mean_accepted_tokens(records: list[dict]) -> float:
    """#MAT: tokens per decode step over the records' turns, (new tokens - turns) / decode steps, which equals
    np.mean(accept_lengths) wherever the steps' lengths are reported; NaN when a turn's steps are unknown or none."""
    choices = [r["choices"][0] for r in records]
    steps = [s for c in choices for s in c["decoding_steps"]]
    if None in steps or not sum(steps):  # None: a serving engine reported no steps
        return math.nan
    decoded = sum(n - 1 for c in choices for n in c["new_tokens"] if n)
    return decoded / sum(steps)


def speedup_interval(speeds: np.ndarray, baseline_speeds: np.ndarray, samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = 0) -> tuple[float, float]:
    """CI_LEVEL percentile interval of mean(speeds) / mean(baseline_speeds), resampling questions (as pairs) with
    replacement `samples` times from a generator seeded with `seed`; NaNs under two pairs or with samples=0."""
    if len(speeds) < 2 or samples < 1:
        return math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, len(speeds), size=(samples, len(speeds)))  # [samples, n]
    ratios = speeds[picks].mean(axis=1) / baseline_speeds[picks].mean(axis=1)
    tail = (1 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def speedup_text(speedup: float, low: float = math.nan, high: float = math.nan) -> str:
    """`1.35x (1.21-1.49)`, or `1.35x` without an interval, or `—` without a speedup."""
    if speedup is None or math.isnan(speedup):
        return "—"
    return f"{speedup:.2f}x" if math.isnan(low) else f"{speedup:.2f}x ({low:.2f}-{high:.2f})"


def step_facts(records: list[dict]) -> dict:
    """Phase shares of the wall time and mean verified tokens per decode step (NaN for records without them)."""
    choices = [r["choices"][0] for r in records]
    if not choices or any("phase_times" not in c for c in choices):
        return {**{f"{p}_share": math.nan for p in PHASES}, "mean_verified_tokens": math.nan}
    wall = sum(sum(c["wall_time"]) for c in choices)
    facts = {f"{p}_share": sum(t[p] for c in choices for t in c["phase_times"]) / wall for p in PHASES}
    verified = [n for c in choices for turn in c["verified_tokens"] for n in turn]
    facts["mean_verified_tokens"] = sum(verified) / len(verified) if verified else math.nan
    return facts


def _row(method: str, task: str, records: list[dict], baselines: dict[int, dict], threshold: float,
         ci_samples: int, ci_seed: int, profile: Profile | None = None) -> dict:
    new_tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in records)
    speed = sum(tokens_per_second(r) for r in records) / len(records)
    pairs = [(r, baselines[r["question_id"]]) for r in records if r["question_id"] in baselines]
    paired = np.array([[tokens_per_second(r), tokens_per_second(b)] for r, b in pairs]).reshape(-1, 2)  # [n, 2]
    baseline_speed = paired[:, 1].mean() if pairs else math.nan
    low, high = speedup_interval(paired[:, 0], paired[:, 1], ci_samples, ci_seed)
    share = cpu_share([*records, *(b for r, b in pairs if b is not r)])  # a vanilla run is its own baseline
    matches = [r["exact_match"] for r in records if r.get("exact_match") is not None]
    divergences = [r["divergence"] for r in records if r.get("divergence")]
    accepts = [a for r in records for a in decode_step_accepts(r)]
    row = {
        "method": method,
        "task": task,
        "n_questions": len(records),
        "new_tokens": new_tokens,
        "tokens_per_s": speed,
        "baseline_tokens_per_s": baseline_speed,
        "speedup": speed / baseline_speed if pairs else math.nan,
        "speedup_ci_low": low,
        "speedup_ci_high": high,
        "mean_accepted_tokens": mean_accepted_tokens(records),
        "mean_latency_s": mean_latency(records),
        "baseline_mean_latency_s": mean_latency([b for _, b in pairs]),
        "joules_per_token": joules_per_token(records),
        "baseline_joules_per_token": joules_per_token([b for _, b in pairs]),
        "exact_match": sum(matches) / len(matches) if matches else math.nan,
        "numeric_ties": sum(bool(d.get("numeric_tie")) for d in divergences),
        "exact_until_divergence": matched_share(records, baselines) if matches else math.nan,
        "cpu_share": share,
        "starved": is_starved(share, threshold),
    }
    for k in range(1, ACCEPT_POSITIONS + 1):
        row[f"accept_rate_pos{k}"] = sum(a >= k for a in accepts) / len(accepts) if accepts else math.nan
    row.update(acceptance_aggregates(records))
    row.update(step_facts(records))
    predicted = predicted_speedup(records, profile) if profile is not None else math.nan
    row["predicted_speedup"] = predicted
    row["model_gap"] = row["speedup"] / predicted - 1 if predicted == predicted else math.nan
    row["gap_flagged"] = bool(predicted == predicted and low == low and not low <= predicted <= high)
    row.update(bounds_row(records, profile))
    return row


def summarize(method: str, records: list[dict], baselines: dict[int, dict], *,
              starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD, ci_samples: int = BOOTSTRAP_SAMPLES,
              ci_seed: int = 0, profile: Profile | None = None) -> pd.DataFrame:
    """One row per task present in `records`, plus `overall`. `baselines` maps question_id to the baseline's record;
    ci_samples=0 skips the bootstrap; without a `profile` the predicted speedup is NaN."""
    by_task: dict[str, list[dict]] = {}
    for record in records:
        by_task.setdefault(task_of(record["category"]), []).append(record)
    settings = (starvation_threshold, ci_samples, ci_seed, profile)
    rows = [_row(method, task, rs, baselines, *settings) for task, rs in by_task.items()]
    rows.append(_row(method, "overall", records, baselines, *settings))
    return pd.DataFrame(rows)


def matched_share(records: list[dict], baselines: dict[int, dict]) -> float:
    """exact_match until divergence: the share of the baseline's tokens (all turns) a method reproduced before its first
    divergence (the record's `divergence`: turn, position), over the judged records with a baseline; NaN if none."""
    matched = total = 0
    for record in records:
        baseline = baselines.get(record["question_id"])
        if baseline is None or record.get("exact_match") is None:
            continue
        lengths = baseline["choices"][0]["new_tokens"]
        total += sum(lengths)
        divergence = record.get("divergence")
        if record["exact_match"] or not divergence:
            matched += sum(lengths) if record["exact_match"] else 0
        else:
            matched += sum(lengths[: divergence.get("turn", 0)]) + divergence["position"]
    return matched / total if total else math.nan
