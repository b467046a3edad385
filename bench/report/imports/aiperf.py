"""AIPerf's per-request export, `profile_export.jsonl` (`aiperf profile --export-level records`): one
MetricRecordInfo per line, `{"metadata": {...}, "metrics": {tag: {"value", "unit"}}, "error": ...}`, and from AIPerf
0.13 on, where the server reported per-request speculative decoding, `"spec_decode_acceptance"`: the
SpecDecodeAcceptanceRecord (src/aiperf/common/models/spec_decode_models.py: num_accepted_draft_tokens,
num_spec_steps, acceptance_histogram, ...). One row per file.

Requests counted: those of the profiling phase (`metadata.benchmark_phase`; warm-up left out) that neither failed
(`error`) nor were cancelled. tok/s: our per-question definition over requests, mean of
metrics.output_sequence_length / metrics.request_latency. #MAT: 1 + their accepted draft tokens / their verification
steps (AIPerf's token-weighted acceptance length), from the records' spec_decode_acceptance, else from the metrics
spec_decode_accepted_draft_tokens and spec_decode_steps; acceptance by draft position from the pooled
acceptance_histogram. The method is the folder the file is in (AIPerf's artifact folder, named after the model,
endpoint and load). No vanilla baseline: no speedup.
"""
from __future__ import annotations

from pathlib import Path

from bench.report.imports.shared import POSITIONS, ImportedRow, json_lines, need, refusal

SOURCE = "aiperf"
KIND = "an AIPerf profile_export.jsonl record"
SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}  # AIPerf's time units


def counted(record: dict) -> bool:
    """A request of the profiling phase that completed."""
    metadata = record["metadata"]
    return (metadata.get("benchmark_phase", "profiling") == "profiling" and not record.get("error")
            and not metadata.get("was_cancelled"))


def seconds(record: dict, name: str, path: Path, line: int) -> float:
    """A time metric's value in seconds."""
    value = need(record, f"metrics.{name}.value", path, KIND, line, number=True)
    unit = need(record, f"metrics.{name}.unit", path, KIND, line)
    if unit not in SECONDS:
        raise refusal(path, f"metrics.{name}.unit is {unit!r}, not one of {', '.join(SECONDS)}", line)
    if value <= 0:
        raise refusal(path, f"metrics.{name}.value is {value}, not a duration", line)
    return value * SECONDS[unit]


def acceptance(record: dict, path: Path, line: int) -> tuple[int, int, dict[int, int] | None] | None:
    """(accepted draft tokens, verification steps, histogram or None) of a request that speculated; None if it
    carries no acceptance (speculation off, or no verification step)."""
    spec = record.get("spec_decode_acceptance")
    if spec is not None:
        accepted = need(record, "spec_decode_acceptance.num_accepted_draft_tokens", path, KIND, line, number=True)
        steps = need(record, "spec_decode_acceptance.num_spec_steps", path, KIND, line, number=True)
        histogram = spec.get("acceptance_histogram")
        try:
            return accepted, steps, None if histogram is None else {int(j): int(n) for j, n in histogram.items()}
        except (AttributeError, TypeError, ValueError):
            raise refusal(path, "spec_decode_acceptance.acceptance_histogram is not a map of accepted draft tokens "
                                "to step counts", line) from None
    if "spec_decode_steps" in record["metrics"]:
        steps = need(record, "metrics.spec_decode_steps.value", path, KIND, line, number=True)
        accepted = need(record, "metrics.spec_decode_accepted_draft_tokens.value", path, KIND, line, number=True)
        return accepted, steps, None
    return None


def rows(path: Path) -> list[ImportedRow]:
    """The file's one row."""
    rates, tokens, accepted, steps, histograms = [], 0, 0, 0, []
    for line, record in json_lines(path, KIND):
        if not isinstance(record.get("metadata"), dict):
            raise refusal(path, f"not {KIND}: no field metadata", line)
        if not counted(record):  # (a failed request's metrics may be null)
            continue
        if not isinstance(record.get("metrics"), dict):
            raise refusal(path, f"not {KIND}: no field metrics", line)
        generated = need(record, "metrics.output_sequence_length.value", path, KIND, line, number=True)
        rates.append(generated / seconds(record, "request_latency", path, line))
        tokens += generated
        spec = acceptance(record, path, line)
        if spec is not None:
            accepted, steps = accepted + spec[0], steps + spec[1]
            histograms.append(spec[2])
    if not rates:
        raise refusal(path, "no completed request of the profiling phase (every record failed, was cancelled or "
                            "warmed up)")
    row = ImportedRow(SOURCE, str(path), path.resolve().parent.name, n_questions=len(rates), new_tokens=tokens,
                      tokens_per_s=sum(rates) / len(rates))
    if steps:
        row.mean_accepted_tokens = 1 + accepted / steps
        if histograms and None not in histograms:
            row.accept_rates = at_least(histograms)
    return [row]


def at_least(histograms: list[dict[int, int]]) -> list[float]:
    """Share of the pooled verification steps that accepted at least k draft tokens, k = 1 .. POSITIONS."""
    pooled: dict[int, int] = {}
    for histogram in histograms:
        for j, n in histogram.items():
            pooled[j] = pooled.get(j, 0) + n
    total = sum(pooled.values())
    return [sum(n for j, n in pooled.items() if j >= k) / total for k in range(1, POSITIONS + 1)] if total else []
