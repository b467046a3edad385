"""`vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's result_json; `--append-result` files hold one
per line): a row per result.

Read: `model_id`, `backend` and `label` (the row's method: the label, else the backend, as vLLM names the file),
`max_concurrency` (the row's batch size), `completed` (requests), `total_output_tokens`, `output_throughput` (tok/s:
generated tokens / benchmark duration, all requests in flight together) and, where the server speculated and vLLM
read its Prometheus counters, `spec_decode_acceptance_length` (#MAT: 1 + accepted tokens / drafts) and
`spec_decode_per_position_acceptance_rates` (acceptance by draft position). No vanilla baseline: no speedup.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.report.imports.shared import ImportedRow, json_lines, need, read_text, refusal

SOURCE = "vllm-bench-serve"
KIND = "a vLLM bench serve result (vllm bench serve --save-result)"


def results(path: Path) -> list[tuple[int | None, dict]]:
    """(line number or None, result) of the file's results: the whole file, or one per line (`--append-result`)."""
    text = read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return json_lines(path, KIND)
    if not isinstance(value, dict):
        raise refusal(path, f"not {KIND}: a JSON {type(value).__name__}, not an object")
    return [(None, value)]


def rows(path: Path) -> list[ImportedRow]:
    """A row per result in the file."""
    out, found = [], results(path)
    for line, result in found:
        where = str(path) if line is None else f"{path} line {line}"  # a row (and setting) of its own
        model = need(result, "model_id", path, KIND, line)
        backend = need(result, "backend", path, KIND, line)
        concurrency = None if result.get("max_concurrency") is None else \
            need(result, "max_concurrency", path, KIND, line, number=True)
        row = ImportedRow(SOURCE, where, str(result.get("label") or backend), model=str(model),
                          batch_size=None if concurrency is None else int(concurrency),
                          n_questions=need(result, "completed", path, KIND, line, number=True),
                          new_tokens=need(result, "total_output_tokens", path, KIND, line, number=True),
                          tokens_per_s=need(result, "output_throughput", path, KIND, line, number=True))
        if result.get("spec_decode_num_drafts"):
            row.mean_accepted_tokens = need(result, "spec_decode_acceptance_length", path, KIND, line, number=True)
            if result.get("spec_decode_per_position_acceptance_rates") is not None:
                row.accept_rates = need(result, "spec_decode_per_position_acceptance_rates", path, KIND, line,
                                        number="list")
        out.append(row)
    return out
