"""The report's "All sources side by side" table, where results of other tools were imported (bench/report/imports/):
our runs' rows and the imported ones in Spec-Bench's layout, a row per source, setting and method, each naming its
source and setting."""
from __future__ import annotations

import math

import pandas as pd

from bench.measure.metrics import speedup_text
from bench.report.imports import OURS
from bench.report.tables import MAT_COLUMN, OVERALL_COLUMN, RATE_COLUMNS, task_headings, wide_table

SOURCE_NOTES = (
    "Every source's rows side by side, each over its own baseline and measured in its own setting, so rows of "
    "different sources or settings are not paired with each other. Speedup: ours over vanilla decoded interleaved in "
    "the same run; spec-bench over its vanilla answer file, as its evaluation/speed.py computes it; vllm-bench-serve "
    "and aiperf have no vanilla baseline, so no speedup. tok/s: ours, spec-bench's and aiperf's the mean tokens/s per "
    "question or request; vllm-bench-serve's its output_throughput (generated tokens / benchmark duration, every "
    "request in flight together). #MAT: tokens per verification step, the target's own included (ours and "
    "spec-bench's the mean accept length; vllm-bench-serve's and aiperf's 1 + accepted draft tokens / verification "
    "steps as the engine counts them). Overall is over the tasks each row ran. — where a source does not report it."
)


def setting_text(row: pd.Series) -> str:
    """What a row was measured in, as far as its source says: model, device, dtype, tokens per turn, sampling,
    batch (or a server's concurrency)."""
    known = {key: row[key] for key in ("model", "device", "dtype", "max_new_tokens", "temperature", "batch_size")
             if row[key] is not None and not (isinstance(row[key], float) and math.isnan(row[key]))}
    parts = [str(known[key]) for key in ("model", "device", "dtype") if key in known]
    if "max_new_tokens" in known:
        parts.append(f"max_new_tokens {int(known['max_new_tokens'])}")
    if float(known.get("temperature", 0)) != 0:
        parts.append(f"temperature {float(known['temperature']):g}")
    if "batch_size" in known and int(known["batch_size"]) != 1:
        parts.append(f"batch {int(known['batch_size'])}")
    return " · ".join(parts) or "—"


def _number(value: float, digits: int) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def sources_table(board: pd.DataFrame) -> pd.DataFrame:
    """A row per setting and method of `board` (the leaderboard with its imported rows and `source` column): Method,
    Source, Setting, speedup per task (its interval where it has one), #MAT, Overall, vanilla tok/s, tok/s; best
    Overall first, rows without a speedup last."""
    headings = task_headings(board.task)
    ran = [task for task in headings if task in set(board.task)]
    rows = []
    for _, group in board.groupby("setting", sort=False):
        first = group.iloc[0]
        for wide in wide_table(group).to_dict("records"):
            row = {"Method": wide["Method"], "Source": first["source"], "Setting": setting_text(first)}
            for task in ran:
                row[headings[task]] = speedup_text(wide[headings[task]], *wide["_intervals"][headings[task]])
            row[MAT_COLUMN] = _number(wide[MAT_COLUMN], 2)
            row[OVERALL_COLUMN] = speedup_text(wide[OVERALL_COLUMN], *wide["_intervals"][OVERALL_COLUMN])
            row.update({heading: _number(wide[heading], 1) for heading in RATE_COLUMNS.values()})
            row["_overall"] = wide[OVERALL_COLUMN]
            rows.append(row)
    table = pd.DataFrame(rows).sort_values("_overall", ascending=False, na_position="last", kind="stable")
    return table.drop(columns="_overall").reset_index(drop=True)


def imported_files(board: pd.DataFrame) -> list[str]:
    """A line per imported file (the `runs` of the rows from other sources): `<source>: <file>`."""
    imported = board[board.source != OURS]
    return [f"{source}: {runs}" for source, runs in imported[["source", "runs"]].drop_duplicates().itertuples(
        index=False)]
