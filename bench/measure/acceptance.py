"""Acceptance per request, as the field now reads it: one record per turn (a request), in the shape of AIPerf's
`SpecDecodeAcceptanceRecord` (ai-dynamo/aiperf, src/aiperf/common/models/spec_decode_models.py), and the aggregates
that tools disagree on (docs/metrics.md, "Acceptance per request").

A turn's decode steps are split by whether the drafter proposed anything. AIPerf's fields, like vLLM's counters, count
the steps that drafted (`num_spec_steps`): `mean_acceptance_length` = 1 + accepted drafts / drafted steps; Spec-Bench's
#MAT counts every decode step. Beyond AIPerf's fields a record holds `num_decode_steps`, `steps_without_draft` and,
per drafted step, the cached context it drafted at (`per_step_context`).

Where a source cannot tell (a server that reports only totals, records written before `drafted_tokens`), a field is
None, never guessed; `aiperf_export` leaves such requests out and says how many.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.errors import ConfigError
from bench.planning.costmodel import turn_contexts  # at context 0: tokens decoded before each step

ACCEPTANCE_FILE = "acceptance.jsonl"  # a run folder's per-request records
AIPERF_FIELDS = ("engine", "mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
                 "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps", "num_spec_tokens",
                 "completion_tokens", "per_step_accepted", "per_step_drafted")
CONTEXT_EDGES = (1024, 2048, 4096, 8192)  # context-length bins (the long-input task's buckets: long_1k ... long_7k)
POSITION_EDGES = (32, 64, 128, 256)  # bins of a step's position within its answer (tokens decoded before it)


class AcceptanceRecordError(ConfigError):
    """A per-request record whose counts contradict each other."""


@dataclass
class TurnSteps:
    """One turn's decode steps: tokens each added, draft nodes each verified (None: not recorded), its prompt's
    length (None: not recorded) and its new tokens; `accepted`/`drafted` are a server's per-turn totals."""

    question_id: int
    turn: int
    category: str
    lengths: list[int] | None  # None: the steps' lengths were not reported
    drafted: list[int] | None
    prompt_tokens: int | None
    new_tokens: int
    decode_steps: int | None
    accepted: int | None = None
    drafted_total: int | None = None


def turn_steps(record: dict) -> list[TurnSteps]:
    """The turns of an answer record with their steps (the records' flat accept_lengths split by decoding_steps)."""
    choice = record["choices"][0]
    lengths, start, turns = choice.get("accept_lengths") or [], 0, []
    for turn, steps in enumerate(choice["decoding_steps"]):
        own = None
        if steps is not None and len(lengths) >= start + steps and (steps == 0 or lengths):
            own = lengths[start:start + steps]
            start += steps
        drafted = choice.get("drafted_tokens", [None] * (turn + 1))[turn]
        prompt = choice.get("prompt_tokens", [None] * (turn + 1))[turn]
        turns.append(TurnSteps(record["question_id"], turn, record.get("category", ""), own, drafted, prompt,
                               choice["new_tokens"][turn], steps, _turn_value(choice, "accepted", turn),
                               _turn_value(choice, "drafted", turn)))
    return turns


def _turn_value(choice: dict, key: str, turn: int):
    values = choice.get(key)
    return values[turn] if isinstance(values, list) and turn < len(values) else None


def request_record(steps: TurnSteps, method: str, engine: str) -> dict:
    """The per-request record of one turn (module docstring); counts a source did not report are None."""
    record = {"request_id": f"{steps.question_id}-{steps.turn}", "question_id": steps.question_id,
              "turn": steps.turn, "category": steps.category, "method": method, "engine": engine,
              "completion_tokens": steps.new_tokens, "num_decode_steps": steps.decode_steps}
    if steps.lengths is not None and steps.drafted is not None:
        spec = [(length - 1, drafted, position) for length, drafted, position in
                zip(steps.lengths, steps.drafted, turn_contexts(0, steps.lengths)) if drafted]
        accepted = [a for a, _, _ in spec]
        drafted = [d for _, d, _ in spec]
        record.update(per_step_accepted=accepted, per_step_drafted=drafted,
                      per_step_context=None if steps.prompt_tokens is None else
                      [steps.prompt_tokens + p for _, _, p in spec],
                      steps_without_draft=len(steps.lengths) - len(spec))
    elif steps.lengths is not None and steps.drafted_total is not None:  # a server: per-step drafts not reported
        accepted, drafted = [length - 1 for length in steps.lengths], None
        record.update(per_step_accepted=None, per_step_drafted=None, per_step_context=None, steps_without_draft=None)
    else:
        record.update(per_step_accepted=None, per_step_drafted=None, per_step_context=None, steps_without_draft=None)
        return {**record, **_totals(steps.accepted, steps.drafted_total, None, None)}
    total_drafted = sum(drafted) if drafted is not None else steps.drafted_total
    return {**record, **_totals(sum(accepted), total_drafted, dict(sorted(Counter(accepted).items())),
                                 len(accepted), fixed_k(drafted))}


def _totals(accepted: int | None, drafted: int | None, histogram: dict | None, spec_steps: int | None,
            k: int | None = None) -> dict:
    rate = accepted / drafted if accepted is not None and drafted else None
    length = 1 + accepted / spec_steps if accepted is not None and spec_steps else None
    return {"mean_acceptance_length": length, "draft_acceptance_rate": rate, "acceptance_histogram": histogram,
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted, "num_spec_steps": spec_steps,
            "num_spec_tokens": k}


def fixed_k(drafted: list[int] | None) -> int | None:
    """k where every drafted step drafted the same number of tokens, else None (AIPerf's num_spec_tokens)."""
    sizes = set(drafted or ())
    return sizes.pop() if len(sizes) == 1 else None


def broken_invariant(record: dict) -> str | None:
    """The first of AIPerf's invariants (and ours on the per-step lists) that `record` breaks, in words; None."""
    histogram, steps = record.get("acceptance_histogram"), record.get("num_spec_steps")
    accepted, drafted = record.get("num_accepted_draft_tokens"), record.get("num_draft_tokens")
    if histogram is not None:
        histogram = {int(j): count for j, count in histogram.items()}
        if any(j < 0 or count < 0 for j, count in histogram.items()):
            return "acceptance_histogram has a negative key or count"
        if sum(histogram.values()) != steps:
            return f"acceptance_histogram counts sum to {sum(histogram.values())}, but num_spec_steps is {steps}"
        if sum(j * count for j, count in histogram.items()) != accepted:
            return (f"acceptance_histogram j-weighted sum is {sum(j * c for j, c in histogram.items())}, but "
                    f"num_accepted_draft_tokens is {accepted}")
    if accepted is not None and drafted is not None and accepted > drafted:
        return f"num_accepted_draft_tokens ({accepted}) exceeds num_draft_tokens ({drafted})"
    per_accepted, per_drafted = record.get("per_step_accepted"), record.get("per_step_drafted")
    if per_accepted is not None and (len(per_accepted) != steps or sum(per_accepted) != accepted):
        return f"per_step_accepted ({len(per_accepted)} steps, {sum(per_accepted)} tokens) does not match " \
               f"num_spec_steps ({steps}) and num_accepted_draft_tokens ({accepted})"
    if per_drafted is not None:
        if len(per_drafted) != steps or sum(per_drafted) != drafted:
            return f"per_step_drafted ({len(per_drafted)} steps, {sum(per_drafted)} tokens) does not match " \
                   f"num_spec_steps ({steps}) and num_draft_tokens ({drafted})"
        if per_accepted is not None and any(a > d for a, d in zip(per_accepted, per_drafted)):
            return "a step's per_step_accepted exceeds its per_step_drafted"
    without, decode = record.get("steps_without_draft"), record.get("num_decode_steps")
    if without is not None and decode is not None and steps is not None and without + steps != decode:
        return f"steps_without_draft ({without}) + num_spec_steps ({steps}) != num_decode_steps ({decode})"
    return None


def checked(record: dict, where: str) -> dict:
    """`record`, or AcceptanceRecordError naming `where`, the request and the invariant it breaks."""
    problem = broken_invariant(record)
    if problem:
        raise AcceptanceRecordError(f"{where}: request {record.get('request_id')}: {problem}")
    return record


def request_records(records: list[dict], method: str, engine: str = "specbench") -> list[dict]:
    """Every turn of `records` (answer records) as a checked per-request record, in question order."""
    out = []
    for record in sorted(records, key=lambda r: r["question_id"]):
        for steps in turn_steps(record):
            out.append(checked(request_record(steps, method, engine), f"{method} question {record['question_id']}"))
    return out


def write_acceptance(folder: Path, records: list[dict], method: str, engine: str = "specbench") -> Path:
    """`folder`/acceptance.jsonl from the run's answer records (rewritten whole, so a resumed run's file is whole)."""
    path = Path(folder) / ACCEPTANCE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in request_records(records, method, engine)))
    tmp.replace(path)
    return path


def read_acceptance(path: Path) -> list[dict]:
    """The per-request records of `path`, each checked (AcceptanceRecordError on the first broken one)."""
    out = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            out.append(checked(json.loads(line), f"{path} line {line_no}"))
    return out


def aiperf_export(requests: list[dict]) -> tuple[list[dict], int]:
    """AIPerf's SpecDecodeAcceptanceRecord of every request that has all its required fields (and drafted), and how
    many were left out (vanilla's turns, servers that report only totals)."""
    out = []
    for request in requests:
        if any(request.get(k) is None for k in ("mean_acceptance_length", "draft_acceptance_rate",
                                                "acceptance_histogram", "num_draft_tokens", "num_spec_steps")):
            continue
        item = {k: request.get(k) for k in AIPERF_FIELDS}
        item["acceptance_histogram"] = {str(j): c for j, c in request["acceptance_histogram"].items()}
        out.append(item)
    return out, len(requests) - len(out)


# --- aggregates over answer records ----------------------------------------------------------------------------------

def acceptance_aggregates(records: list[dict]) -> dict:
    """The aggregates that rank methods differently (docs/metrics.md): #MAT per request (mean over turns of each
    turn's tokens per decode step; pooled #MAT is metrics.mean_accepted_tokens), the accept length over drafted steps
    only (vLLM's, AIPerf's), the draft acceptance rate (accepted / drafted tokens), the share of decode steps that
    drafted nothing and the largest draft of a step (k); NaN where the records cannot tell."""
    turns = [t for r in records for t in turn_steps(r)]
    per_request = [(t.new_tokens - 1) / t.decode_steps for t in turns if t.decode_steps]
    stepped = [t for t in turns if t.lengths is not None and t.drafted is not None]
    known = len(stepped) == len(turns) and turns
    spec = [(length - 1, d) for t in stepped for length, d in zip(t.lengths, t.drafted) if d]
    all_steps = sum(len(t.lengths) for t in stepped)
    accepted, drafted = sum(a for a, _ in spec), sum(d for _, d in spec)
    if not known:  # a server's totals, where reported for every turn
        totals = [(t.accepted, t.drafted_total) for t in turns]
        if turns and all(a is not None and d is not None for a, d in totals):
            accepted, drafted = sum(a for a, _ in totals), sum(d for _, d in totals)
        else:
            accepted = drafted = 0
    return {
        "mean_accepted_tokens_per_request": sum(per_request) / len(per_request) if per_request else math.nan,
        "accept_length_drafted_steps": 1 + accepted / len(spec) if known and spec else math.nan,
        "draft_acceptance_rate": accepted / drafted if drafted else math.nan,
        "steps_without_draft_share": (all_steps - len(spec)) / all_steps if known and all_steps else math.nan,
        "draft_k": max((d for _, d in spec), default=math.nan) if known else math.nan,
    }


def step_table(records: list[dict]) -> list[dict]:
    """Every decode step of `records` with what it drafted, accepted, and where: {context, position, drafted,
    accepted} (accepted drafts, the target's own token left out); steps of turns without per-step data are left out."""
    rows = []
    for t in (t for r in records for t in turn_steps(r)):
        if t.lengths is None or t.drafted is None or t.prompt_tokens is None:
            continue
        for length, drafted, position in zip(t.lengths, t.drafted, turn_contexts(0, t.lengths)):
            rows.append({"context": t.prompt_tokens + position, "position": position, "drafted": drafted,
                         "accepted": length - 1})
    return rows


def bin_label(value: int, edges: tuple[int, ...]) -> str:
    """`<1024`, `1024-2047`, ..., `>=8192` for `value` against `edges`."""
    if value < edges[0]:
        return f"<{edges[0]}"
    for low, high in zip(edges, edges[1:]):
        if value < high:
            return f"{low}-{high - 1}"
    return f">={edges[-1]}"


def bin_labels(edges: tuple[int, ...]) -> list[str]:
    """Every bin_label of `edges`, in order."""
    return [f"<{edges[0]}", *(f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])), f">={edges[-1]}"]
