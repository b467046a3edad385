"""Speculation counters of the engines that publish them in shapes of their own, read as SpecCounters: TGI's
`tgi_request_skipped_tokens` summary on /metrics (and a turn's steps from it), MLC-LLM's engine metrics (JSON, POST
/debug/dump_engine_metrics). vLLM, llama.cpp and LMDeploy share one Prometheus naming (acceptance.parse_counters)."""
from __future__ import annotations

import json

from bench.measure.serving.acceptance import COUNTER_PREFIXES, SAMPLE, SpecCounters, decode_steps, parse_counters
from bench.measure.serving.http import get_text, post_text

OWN_FORMATS = ("tgi", "mlc_llm")
TGI_SKIPPED = "tgi_request_skipped_tokens"


def reads_counters(engine: str) -> bool:
    """Whether the engine publishes speculation counters the harness reads."""
    return engine in COUNTER_PREFIXES or engine in OWN_FORMATS


def read_counters(engine: str, url: str, timeout: float) -> SpecCounters | None:
    """The engine's counters at `url` now (None: none there); raises urllib's errors."""
    if engine == "mlc_llm":
        return parse_mlc_metrics(post_text(url, {}, timeout))
    text = get_text(url, timeout)
    return parse_tgi_summary(text) if engine == "tgi" else parse_counters(text, COUNTER_PREFIXES[engine])


def parse_tgi_summary(text: str) -> SpecCounters | None:
    """TGI's skipped tokens: one sample per step of every request, the tokens it made after the first
    (backends/v3/src/backend.rs send_responses), the prefill's step included (it makes one token, sample 0); a
    Prometheus summary (its buckets are commented out in router/src/server.rs) whose _count and _sum are totals
    since start. `drafts` holds the steps (_count) and `accepted` the accepted drafts (_sum); TGI counts neither the
    draft tokens nor per position. None before TGI made any step."""
    totals = {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match and match.group(1) in (f"{TGI_SKIPPED}_sum", f"{TGI_SKIPPED}_count"):
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(3))
    if len(totals) < 2:
        return None
    return SpecCounters(drafts=totals[f"{TGI_SKIPPED}_count"], accepted=totals[f"{TGI_SKIPPED}_sum"])


def parse_mlc_metrics(text: str) -> SpecCounters | None:
    """MLC-LLM's `spec_decode` counts (cpp/serve/metrics.h SpecDecodeMetrics): each verification step of k drafts
    adds 1 to draft_count[0..k] and to accept_count[0..a] for a accepted drafts (the step's own token at index 0),
    so accept_count[0] is the speculative steps, accept_count[j] the steps accepting >= j drafts. FastAPI renders the
    returned EngineMetrics object by its attribute (`{"metrics": {...}}`). Zero counts before the first speculative
    step (metrics.cc leaves spec_decode out until then); None for a body that is not MLC's engine metrics."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    metrics = data.get("metrics", data) if isinstance(data, dict) else None
    if not isinstance(metrics, dict) or ("spec_decode" not in metrics and "completion_tokens_sum" not in metrics):
        return None
    spec = metrics.get("spec_decode") or {}
    drafted, accepted = spec.get("draft_count") or [0], spec.get("accept_count") or [0]
    return SpecCounters(drafts=float(accepted[0]), draft_tokens=float(sum(drafted[1:])),
                        accepted=float(sum(accepted[1:])),
                        per_position={k: float(n) for k, n in enumerate(accepted[1:])})


def from_tgi_steps(new_tokens: int, delta: SpecCounters | None) -> dict | None:
    """Decode steps of a turn from TGI's summary read around it: its steps (the prefill's among them) and accepted
    drafts are both counted, so they must add up to the turn's tokens; None where they do not (other traffic counted
    in) or without counts. Per-step lengths are not reported (a summary keeps quantiles over a window), except that
    no accepted draft means one token a step."""
    if delta is None:
        return None
    steps, accepted = int(round(delta.drafts)), int(round(delta.accepted))
    if steps + accepted != new_tokens:
        return None
    decode = decode_steps(new_tokens, accepted)
    return {"decode_steps": decode, "accept_lengths": [1] * decode if accepted == 0 else [],
            "acceptance_source": "tgi_metrics", "drafted": None, "accepted": accepted}
