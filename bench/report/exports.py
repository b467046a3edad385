"""Our runs in other tools' formats, written beside the report: AIPerf's per-request export
(`aiperf/<setting>/<method>/profile_export.jsonl`, what `aiperf profile --export-level records` writes), one line per
request (a turn) with its output length and latency and, where the method drafted, its `spec_decode_acceptance`
(bench/measure/acceptance.py's record reduced to AIPerf's SpecDecodeAcceptanceRecord). `--aiperf` reads it back."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.measure.acceptance import aiperf_export, request_records

AIPERF_FOLDER = "aiperf"


def aiperf_lines(records: list[dict], method: str, engine: str) -> list[dict]:
    """One MetricRecordInfo-shaped line per turn of `records`: metadata, metrics (tokens, ms) and the acceptance."""
    requests = request_records(records, method, engine)
    records_by_id = {r["question_id"]: r for r in records}
    lines = []
    for number, request in enumerate(requests):
        record, turn = records_by_id[request["question_id"]], request["turn"]
        choice = record["choices"][0]
        exported, _ = aiperf_export([request])
        start, end = request_times(record, turn)
        lines.append({
            "metadata": {"session_num": number, "x_request_id": request["request_id"],
                         "conversation_id": str(request["question_id"]), "turn_index": turn,
                         "request_start_ns": start, "request_end_ns": end, "worker_id": engine,
                         "record_processor_id": "specbench", "benchmark_phase": "profiling", "was_cancelled": False},
            "metrics": {"output_sequence_length": {"value": choice["new_tokens"][turn], "unit": "tokens"},
                        "request_latency": {"value": choice["wall_time"][turn] * 1e3, "unit": "ms"},
                        **({"input_sequence_length": {"value": choice["prompt_tokens"][turn], "unit": "tokens"}}
                           if "prompt_tokens" in choice else {})},
            "error": None,
            **({"spec_decode_acceptance": exported[0]} if exported else {}),
        })
    return lines


def request_times(record: dict, turn: int) -> tuple[int, int]:
    """A turn's (start, end) in ns since the epoch, as the turn's wall times lie before the record's `tstamp` (when it
    was written, after its last turn): end - start is the turn's wall time."""
    walls = record["choices"][0]["wall_time"]
    end = record.get("tstamp", 0.0) - sum(walls[turn + 1:])
    return int((end - walls[turn]) * 1e9), int(end * 1e9)


def write_aiperf_exports(latest: pd.DataFrame, labels: dict, slugs: dict[str, str], out: Path) -> list[Path]:
    """Every drafting method's latest runs of each setting as `aiperf/<slug>/<method>/profile_export.jsonl`."""
    written = []
    for (setting, method_config), rows in latest[~latest.is_baseline].groupby(["setting", "method_config"],
                                                                               sort=False):
        device = str(rows.iloc[0].device)
        engine = device.split(":", 1)[1] if device.startswith("server:") else "specbench"
        label = labels[setting, method_config]
        path = out / AIPERF_FOLDER / slugs[setting] / label / "profile_export.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = aiperf_lines(list(rows.record), label, engine)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        written.append(path)
    return written
