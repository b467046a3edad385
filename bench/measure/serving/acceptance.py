"""Acceptance as the engine reports it, turned into our records' fields (decoding_steps, accept_lengths).

A turn of n new tokens with `accepted` accepted draft tokens took n - 1 - accepted decode steps after its prefill
(the prefill gives the first token; each decode step adds its accepted drafts plus one token of the target's own),
so #MAT = (n - 1) / decode steps, Spec-Bench's definition, as for our engine (bench/records.py). llama.cpp reports
`timings.draft_n_accepted` per response; vLLM, LMDeploy and llama.cpp (with --metrics) count server-wide on /metrics
in Prometheus' text format, read around each request at concurrency 1 (per turn, with the per-position counts) and
around the run (per run, where other traffic leaks in), as TGI and MLC-LLM do in shapes of their own
(engine_counters.py); vLLM also per request, in the response, when launched with --per-request-spec-decode-metrics;
SGLang reports per request in its native /generate's meta_info. Where nothing is reported the turn's steps are None
(NaN in the metrics), never a guess."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

COUNTER_PREFIXES = {"vllm": "vllm:", "llamacpp": "llamacpp:", "lmdeploy": "lmdeploy:"}  # vLLM's names
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                                                "spec_decode_num_accepted_tokens_total",
                                                "spec_decode_num_accepted_tokens_per_pos_total")
SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class SpecCounters:
    """Speculation counters (summed over label sets other than position): drafts (speculative steps), draft tokens
    proposed, accepted tokens, and accepted tokens per draft position (0-based)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        positions = set(self.per_position) | set(before.per_position)
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted,
                            {k: self.per_position.get(k, 0.0) - before.per_position.get(k, 0.0) for k in positions})

    def as_dict(self) -> dict:
        al = 1 + self.accepted / self.drafts if self.drafts else None
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "accepted_per_position": {str(k): v for k, v in sorted(self.per_position.items())},
                "acceptance_length": al}


def parse_counters(text: str, prefix: str) -> SpecCounters | None:
    """The speculation counters named `<prefix>spec_decode_*` in a Prometheus exposition; None when it has none
    (speculation off, or an engine that does not count)."""
    counters, seen = SpecCounters(), False
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match or not match.group(1).startswith(prefix):
            continue
        name, value = match.group(1)[len(prefix):], float(match.group(3))
        labels = dict(LABEL.findall(match.group(2) or ""))
        if name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
            attribute = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED: "accepted"}[name]
            setattr(counters, attribute, getattr(counters, attribute) + value)
            seen = True
        elif name == PER_POSITION and "position" in labels:
            position = int(labels["position"])
            counters.per_position[position] = counters.per_position.get(position, 0.0) + value
            seen = True
    return counters if seen else None


def from_timings(new_tokens: int, timings: dict | None) -> dict | None:
    """Steps of a turn from llama.cpp's per-response timings (draft_n_accepted), None without timings. llama.cpp
    leaves draft_n / draft_n_accepted out when the turn drafted nothing (tools/server/server-common.cpp:
    `if (n_draft_tokens > 0)`), so timings without them are 0 drafted: one token a step. Per-step lengths are not
    reported: accept_lengths stays empty."""
    if not timings or (timings.get("draft_n_accepted") is None and timings.get("predicted_n") is None):
        return None
    accepted = int(timings.get("draft_n_accepted") or 0)
    return {"decode_steps": decode_steps(new_tokens, accepted), "accept_lengths": [],
            "acceptance_source": "llamacpp_timings", "drafted": int(timings.get("draft_n") or 0), "accepted": accepted}


def from_counters(new_tokens: int, delta: SpecCounters | None, source: str) -> dict | None:
    """Steps of a turn from the counters' difference around it; accept_lengths rebuilt from the per-position counts
    (drafts accepting exactly k = count(position k-1) - count(position k)): the step order is not reported, so they
    are the turn's steps sorted by length, whose per-position shares are exact. None without counts."""
    if delta is None:
        return None
    accepted = int(round(delta.accepted))
    steps = decode_steps(new_tokens, accepted)
    lengths: list[int] = []
    if steps > 0 and (delta.per_position or accepted == 0):  # llama.cpp creates per-position series lazily
        counts = [int(round(delta.per_position.get(k, 0.0))) for k in range(max(delta.per_position, default=-1) + 1)]
        exactly = [int(round(delta.drafts)) - (counts[0] if counts else 0)]
        exactly += [counts[k] - counts[k + 1] for k in range(len(counts) - 1)] + counts[-1:]
        lengths = steps_from_histogram(exactly, steps, new_tokens)
    return {"decode_steps": steps, "accept_lengths": lengths, "acceptance_source": source,
            "drafted": int(round(delta.draft_tokens)), "accepted": accepted}


def decode_steps(new_tokens: int, accepted: int) -> int:
    """Decode steps of a turn of `new_tokens` tokens of which `accepted` were accepted drafts (the prefill gave one)."""
    return max(new_tokens - 1 - accepted, 0)


def steps_from_histogram(exactly: list[int], steps: int, new_tokens: int) -> list[int]:
    """A turn's decode step lengths from how many speculative steps accepted exactly k drafts (`exactly[k]`): the
    speculative steps longest first, then one-token steps that drafted nothing. [] when they do not add up to the
    turn's decode steps and its tokens after the prefill's (other traffic counted in, or another turn's histogram)."""
    decode = sorted((1 + k for k, n in enumerate(exactly) for _ in range(n)), reverse=True)
    lengths = decode + [1] * max(0, steps - len(decode))
    return lengths if len(lengths) == steps and sum(lengths) == new_tokens - 1 else []


def from_vllm_request(new_tokens: int, metrics: dict | None) -> dict | None:
    """Steps of a turn from vLLM's per-request `metrics.speculative_decoding` (--per-request-spec-decode-metrics,
    vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics): every verify step's accepted drafts in
    order (per_step_accepted, the `detailed` level), else the histogram of steps by accepted drafts (longest first).
    vLLM counts a step's accepted drafts before max_tokens or a stop cuts them, so the steps are fitted to the turn's
    tokens (fit_steps). None without them."""
    if not metrics or metrics.get("num_accepted_draft_tokens") is None:
        return None
    ordered = metrics.get("per_step_accepted")
    if ordered is None:
        histogram = metrics.get("acceptance_histogram") or []
        ordered = sorted((j for j, count in enumerate(histogram) for _ in range(int(count))), reverse=True)
    lengths = fit_steps([1 + int(a) for a in ordered], new_tokens - 1)
    return {"decode_steps": len(lengths), "accept_lengths": lengths, "acceptance_source": "vllm_request_metrics",
            "drafted": int(metrics.get("num_draft_tokens") or 0), "accepted": max(new_tokens - 1 - len(lengths), 0)}


def fit_steps(lengths: list[int], decoded: int) -> list[int]:
    """Decode step lengths that add up to the turn's `decoded` tokens (those after the prefill's): cut where they reach
    it (a last step's drafts past max_tokens or a stop are never output), then one-token steps for the steps that
    drafted nothing (the ngram proposer finding no match), whose place among the others is not reported."""
    fitted, total = [], 0
    for length in lengths:
        if total >= decoded:
            break
        fitted.append(min(length, decoded - total))
        total += fitted[-1]
    return fitted + [1] * (decoded - total)


SGLANG_ACCEPTED = ("spec_accepted_drafts", "spec_accepted_tokens", "spec_accept_token_num")  # newest name first
SGLANG_DRAFTED = ("spec_proposed_drafts", "spec_draft_token_num")


def from_sglang_meta(new_tokens: int, meta: dict | None) -> dict | None:
    """Steps of a turn from SGLang's per-request `meta_info` (native /generate, in the last streamed event):
    `spec_verify_ct` verification forwards after the prefill's token, the accepted drafts under the name of the
    version (SGLANG_ACCEPTED), and where given `spec_accept_histogram` (index k: steps that accepted k drafts), which
    yields accept_lengths. None when meta_info has no speculation fields (SGLang adds them only when it verified)."""
    meta = meta or {}
    verify = meta.get("spec_verify_ct")
    accepted = next((meta[k] for k in SGLANG_ACCEPTED if meta.get(k) is not None), None)
    if accepted is None and verify is None:
        return None
    accepted = int(accepted) if accepted is not None else max(0, new_tokens - 1 - int(verify))
    steps = decode_steps(new_tokens, accepted)
    histogram = meta.get("spec_accept_histogram")
    lengths = steps_from_histogram([int(n) for n in histogram], steps, new_tokens) if histogram else []
    drafted = next((int(meta[k]) for k in SGLANG_DRAFTED if meta.get(k) is not None), None)
    return {"decode_steps": steps, "accept_lengths": lengths, "acceptance_source": "sglang_meta_info",
            "drafted": drafted, "accepted": accepted}


def no_speculation(new_tokens: int) -> dict:
    """A server launched without speculation: one token per decode step, by construction."""
    steps = decode_steps(new_tokens, 0)
    return {"decode_steps": steps, "accept_lengths": [1] * steps, "acceptance_source": "no_speculation"}


def unreported() -> dict:
    """The engine reported nothing: steps unknown."""
    return {"decode_steps": None, "accept_lengths": [], "acceptance_source": "none"}
