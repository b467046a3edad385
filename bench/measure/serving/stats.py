"""The serving columns of a server run's summary: percentiles of time to first token (ttft), inter-token latency
(itl, between streamed events that carry tokens) and end-to-end latency (e2e) per request, and output throughput:
new tokens over the wall time of the request groups that decoded them (server.concurrency requests in flight)."""
from __future__ import annotations

import math

import numpy as np

PERCENTILES = (50, 90, 99)


def percentile_columns(name: str, values: list[float]) -> dict:
    """`<name>_p50_s`, `_p90_s`, `_p99_s` of `values` (NaN without values)."""
    if not values:
        return {f"{name}_p{p}_s": math.nan for p in PERCENTILES}
    found = np.percentile(np.asarray(values, dtype=float), PERCENTILES)
    return {f"{name}_p{p}_s": float(v) for p, v in zip(PERCENTILES, found)}


def output_throughput(records: list[dict]) -> float:
    """Tokens per second over the run's wall time: every record's new tokens over the summed wall seconds of the
    distinct request groups they were decoded in (choices[0].group: id, wall_s); NaN without groups."""
    tokens, walls = 0, {}
    for record in records:
        choice = record["choices"][0]
        group = choice.get("group")
        if group is None:
            return math.nan
        tokens += sum(choice["new_tokens"])
        walls[group["id"]] = group["wall_s"]
    seconds = sum(walls.values())
    return tokens / seconds if seconds else math.nan


def serving_columns(records: list[dict], baselines: list[dict]) -> dict:
    """The serving columns of one summary row: the method's latency percentiles and both sides' throughput."""
    choices = [r["choices"][0] for r in records]
    ttft = [t for c in choices for t in c.get("ttft_s", []) if t is not None]
    itl = [gap for c in choices for turn in c.get("itl_s", []) for gap in turn]
    e2e = [t for c in choices for t in c.get("latency", c["wall_time"])]  # the request's own seconds
    return {**percentile_columns("ttft", ttft), **percentile_columns("itl", itl), **percentile_columns("e2e", e2e),
            "output_tokens_per_s": output_throughput(records),
            "baseline_output_tokens_per_s": output_throughput(baselines) if baselines else math.nan}
