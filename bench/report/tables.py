"""The report's tables, recomputed from the loaded runs' answers: the leaderboard (Spec-Bench's layout), acceptance
by position, the cost model's prediction, batch-size sweeps."""
from __future__ import annotations

import json
import math

import pandas as pd

from bench.measure.acceptance import bin_label, bin_labels, step_table
from bench.measure.metrics import ACCEPT_POSITIONS, speedup_text, summarize
from bench.planning.costmodel import Profile
from bench.records import PHASES
from bench.report.runs import SETTING_COLUMNS, method_labels, select_latest

TASK_COLUMNS = {  # Spec-Bench's leaderboard headings, in its order
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}


MAT_COLUMN = "#Mean Accepted Tokens"


OVERALL_COLUMN = "Overall"


ENERGY_COLUMN = "J/token"  # GPU energy per generated token (NVML); only in tables whose runs measured it


DRAFTER_COLUMN = "Drafter"  # where the drafter's weights came from: a release, or trained here for how long on what


LOSSLESS_COLUMN = "Lossless"  # yes where every answer equals vanilla's (numeric ties aside), else how far it matched


RATE_COLUMNS = {"baseline_tokens_per_s": "vanilla tok/s", "tokens_per_s": "tok/s"}  # overall, over the row's questions


ENERGY_COLUMNS = ["joules_per_token", "baseline_joules_per_token"]


POSITION_COLUMNS = [f"accept_rate_pos{k}" for k in range(1, ACCEPT_POSITIONS + 1)]


SHARE_COLUMNS = [f"{phase}_share" for phase in PHASES]


COST_COLUMNS = ["predicted_speedup", "model_gap", "gap_flagged", "mean_verified_tokens", *SHARE_COLUMNS]


BOUND_COLUMNS = ["best_fixed_k", "best_fixed_k_speedup", "oracle_speedup"]  # bench/planning/bounds.py


AGGREGATE_COLUMNS = {  # acceptance aggregates (bench/measure/acceptance.py) as the acceptance table heads them
    "draft_k": "k",
    "mean_accepted_tokens": "#MAT (all steps)",
    "mean_accepted_tokens_per_request": "#MAT (per request)",
    "accept_length_drafted_steps": "accept length (drafted steps)",
    "draft_acceptance_rate": "draft acceptance",
    "steps_without_draft_share": "steps without draft",
}


VANILLA = "vanilla"


def _exactness(records: list[dict]) -> tuple[float, str]:
    """Fraction of questions equal to their baseline or differing only at a numeric tie; the ids of the others."""
    judged = [r for r in records if r.get("exact_match") is not None]
    bad = [r["question_id"] for r in judged
           if not r["exact_match"] and not (r.get("divergence") or {}).get("numeric_tie")]
    return ((len(judged) - len(bad)) / len(judged) if judged else math.nan), ";".join(map(str, sorted(bad)))


def leaderboard(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per setting x method x task (and `overall`) with bench/measure/metrics.py' numbers, from the latest runs.

    A question's baseline is the one decoded interleaved in the method's own run; a run made with
    baseline=false falls back to the latest vanilla run of the same setting, as Spec-Bench pairs two files.
    """
    if runs.empty:
        return board_of(runs, {})
    latest = select_latest(runs)
    return board_of(latest, method_labels(latest))


def board_of(latest: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """leaderboard() of runs already reduced by select_latest, with their method_labels."""
    columns = ["setting", *SETTING_COLUMNS, "method", "task", "n_questions", "new_tokens", "tokens_per_s",
               "baseline_tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high", "mean_accepted_tokens",
               "exact_match", "numeric_ties", "exact_match_or_tie", "exact_until_divergence", "diverged_questions",
               "cpu_share", "starved",
               *POSITION_COLUMNS, *(c for c in AGGREGATE_COLUMNS if c != "mean_accepted_tokens"), *COST_COLUMNS,
               *BOUND_COLUMNS, *ENERGY_COLUMNS, "n_tasks", "torch", "transformers", "finished",
               "runs", "drafter"]
    if latest.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for setting, group in latest.groupby("setting", sort=False):
        values = group.iloc[0][SETTING_COLUMNS].to_dict()
        baseline_runs = {row.question_id: row.record for row in group[group.is_baseline].itertuples()}
        for method_config, rows in group.groupby("method_config", sort=False):
            label = labels[setting, method_config]
            records = list(rows.record)
            own = {row.question_id: row.baseline for row in rows.itertuples() if row.baseline is not None}
            stored = next((p for p in rows.profile if p), None)  # the profile the run used, from its meta.json
            summary = summarize(label, records, {**baseline_runs, **own},
                                starvation_threshold=rows.starvation_threshold.max(),
                                profile=Profile(**stored) if stored else None)
            for _, row in summary.iterrows():
                chosen = rows if row.task == "overall" else rows[rows.task == row.task]
                exact, diverged = _exactness(list(chosen.record))
                out.append({"setting": setting, **values, **row.to_dict(), "exact_match_or_tie": exact,
                            "diverged_questions": diverged, "n_tasks": rows.task.nunique(),
                            "torch": ",".join(sorted(set(map(str, chosen.torch)))),
                            "transformers": ",".join(sorted(set(map(str, chosen.transformers)))),
                            "finished": chosen.finished.max(), "runs": ";".join(sorted(set(chosen.run_dir))),
                            "drafter": next((d for d in chosen.drafter if isinstance(d, str)), None)})
    return pd.DataFrame(out, columns=columns)


def task_headings(tasks) -> dict[str, str]:
    """Column headings: Spec-Bench's six tasks in its order, then any other task among `tasks` (custom tasks,
    headed by their name), alphabetically."""
    custom = sorted(set(tasks) - set(TASK_COLUMNS) - {"overall"})
    return {**TASK_COLUMNS, **{task: task for task in custom}}


def wide_table(board: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench's layout for one setting: a row per method, speedup per task, #MAT, overall; then vanilla's and
    the method's tokens/s, losslessness (LOSSLESS_COLUMN's numbers: exact_match_or_tie, exact_match, numeric ties,
    exact_until_divergence) and J/token where measured; best overall first. Hidden columns: `_intervals` (heading
    -> (low, high)), `_tasks` (the tasks it ran), `_partial` (lacks some of the table's tasks), `_starved`."""
    rows = []
    headings = task_headings(board.task)
    all_tasks = [t for t in headings if t in set(board.task)]
    for method, group in board.groupby("method", sort=False):
        by_task = group.set_index("task")
        overall = by_task.loc["overall"]
        row, intervals = {"Method": method}, {}
        for task, heading in headings.items():
            row[heading], intervals[heading] = _speedup_of(by_task, task)
        row[MAT_COLUMN] = overall.mean_accepted_tokens
        row[OVERALL_COLUMN], intervals[OVERALL_COLUMN] = _speedup_of(by_task, "overall")
        row.update({heading: overall[column] for column, heading in RATE_COLUMNS.items()})
        row[LOSSLESS_COLUMN] = (overall.exact_match_or_tie, overall.exact_match, overall.numeric_ties,
                                overall.get("exact_until_divergence"))
        if "joules_per_token" in board and board.joules_per_token.notna().any():
            row[ENERGY_COLUMN] = overall.joules_per_token
        if "drafter" in board and board.drafter.notna().any():  # runs that recorded it (meta.json drafter_source)
            row[DRAFTER_COLUMN] = overall.drafter if isinstance(overall.drafter, str) else \
                "—" if method == VANILLA else "none (training-free)"
        row["_intervals"], row["_tasks"] = intervals, [t for t in all_tasks if t in by_task.index]
        row["_partial"] = len(row["_tasks"]) < len(all_tasks)
        row["_starved"] = is_flagged(overall.starved)
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values(OVERALL_COLUMN, ascending=False, na_position="last", kind="stable").reset_index(drop=True)


def _speedup_of(by_task: pd.DataFrame, task: str) -> tuple[float, tuple[float, float]]:
    """A task's speedup and its interval from one method's board rows indexed by task (NaNs where not run)."""
    if task not in by_task.index:
        return math.nan, (math.nan, math.nan)
    row = by_task.loc[task]
    return row.speedup, (row.speedup_ci_low, row.speedup_ci_high)


def is_flagged(value) -> bool:
    """A True/False/None (or NaN) column value as a plain bool: only True is flagged."""
    return value is not None and not pd.isna(value) and bool(value)


DIGITS = {MAT_COLUMN: 2, ENERGY_COLUMN: 3, **dict.fromkeys(RATE_COLUMNS.values(), 1)}  # plain numbers' decimals


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """The wide table as displayed: `1.23x (1.10-1.37)` speedups with their interval, plain numbers to DIGITS
    decimals, lossless_text, † on a method that lacks some tasks, ⚠ on one timed while starved of CPU; Overall
    headed by overall_heading."""
    shown = pd.DataFrame({"Method": table.Method})
    for heading in [c for c in table.columns if not c.startswith("_") and c != "Method"]:
        if heading == LOSSLESS_COLUMN:
            shown[heading] = [lossless_text(m, v) for m, v in zip(table.Method, table[heading])]
        elif heading == DRAFTER_COLUMN:
            shown[heading] = table[heading]
        elif heading in DIGITS:
            shown[heading] = table[heading].map(lambda v: "—" if pd.isna(v) else f"{v:.{DIGITS[heading]}f}")
        else:
            shown[heading] = [speedup_text(v, *intervals[heading]) for v, intervals in
                              zip(table[heading], table._intervals)]
    shown[OVERALL_COLUMN] += [(" †" if partial else "") + (" ⚠" if starved else "") for partial, starved in
                              zip(table._partial, table._starved)]
    return shown.rename(columns={OVERALL_COLUMN: overall_heading(table_tasks(table))})


def table_tasks(table: pd.DataFrame) -> list[str]:
    """The tasks any row of a wide table ran, in its column order."""
    ran = {t for tasks in table._tasks for t in tasks}
    return [t for t in task_headings(ran) if t in ran]


def overall_heading(tasks: list[str]) -> str:
    """`Overall` over Spec-Bench's six tasks; over any other set, `Overall (N tasks)`: not Spec-Bench's figure."""
    if set(tasks) == set(TASK_COLUMNS):
        return OVERALL_COLUMN
    return f"{OVERALL_COLUMN} ({len(tasks)} task{'s' * (len(tasks) != 1)})"


def lossless_text(method: str, value: tuple) -> str:
    """LOSSLESS_COLUMN's cell: `yes` where every question equals vanilla's (`yes · 2 ties` where some differ
    only at a numeric tie); else `no · 0.42 exact · 7 ties · 81% compared` (exact_match, numeric ties, and
    the share of vanilla's tokens compared before the first divergences); `reference` on vanilla's row; `—` where
    nothing was compared (sampling)."""
    exact_or_tie, exact, ties, until = value
    if method == VANILLA:
        return "reference"
    if exact_or_tie is None or pd.isna(exact_or_tie):
        return "—"
    ties = f"{int(ties)} tie{'s' * (int(ties) != 1)}"
    if exact_or_tie == 1:
        return "yes" if exact == 1 else f"yes · {ties}"
    compared = "" if until is None or pd.isna(until) else f" · {until:.0%} compared"
    return f"no · {exact:.2f} exact · {ties}{compared}"


def markdown(frame: pd.DataFrame) -> str:
    cells = [[str(c) for c in frame.columns]] + [[str(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join("---" for _ in frame.columns) + " |")
    return "\n".join(lines)


def setting_facts(board: pd.DataFrame, runs: pd.DataFrame) -> dict[str, str]:
    """The header of one table: what the numbers were measured on, from the runs' meta.json."""
    first = board.iloc[0].to_dict()
    counts = sorted({int(n) for n in board[board.task != "overall"].n_questions})
    dates = sorted(d[:10] for d in runs.finished if d)
    torch_versions = ", ".join(sorted(set(runs.torch.astype(str))))
    transformers_versions = ", ".join(sorted(set(runs.transformers.astype(str))))
    temperature = float(first["temperature"])
    return {
        "device": f"{first['device']} ({first['device_name']})",
        "model": str(first["model"]),
        "dtype": str(first["dtype"]),
        "torch": f"{torch_versions} (transformers {transformers_versions})",
        "max_new_tokens": str(first["max_new_tokens"]),
        "batch size": str(first.get("batch_size", 1)),
        "decoding": "greedy" if temperature == 0 else f"sampling, temperature {temperature:g}",
        "questions per task": (str(counts[0]) if len(counts) == 1 else
                               f"{counts[0]}–{counts[-1]} (differs between methods or tasks; see leaderboard.csv)"),
        "date": dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}",
        "runs": str(runs.run_dir.nunique()),
        "nodes": node_names(runs.host),
    }


def node_names(hosts: pd.Series) -> str:
    """The hosts a table's runs ran on (a sweep's SLURM nodes, which share device_name), or how many beyond four."""
    names = sorted({str(h) for h in hosts.dropna()})
    return ", ".join(names) if len(names) <= 4 else f"{len(names)} nodes ({', '.join(names[:3])}, ...)"


def accept_lengths_by_method(runs: pd.DataFrame, labels: dict) -> dict[str, list[int]]:
    """Tokens added per decode step (accepted draft tokens + the target's own): the records' accept_lengths."""
    out: dict[str, list[int]] = {}
    for row in runs.itertuples():
        label = labels[row.setting, row.method_config]
        if not row.is_baseline:
            out.setdefault(label, []).extend(row.record["choices"][0]["accept_lengths"])
    return out


def batch_sweeps(board: pd.DataFrame) -> list[pd.DataFrame]:
    """The overall rows of each group of settings that differ only in batch size, where it has two or more."""
    overall = board[board.task == "overall"]
    if overall.empty:
        return []
    unbatched = [c for c in SETTING_COLUMNS if c != "batch_size"]
    groups = overall.groupby(unbatched, sort=False, dropna=False)
    return [group for _, group in groups if group.batch_size.nunique() > 1]


def sweeps_across_backends(sweeps: list[pd.DataFrame]) -> list[list[pd.DataFrame]]:
    """The sweeps that share model, max_new_tokens and temperature but ran on different backends (device or dtype),
    grouped: each group is drawn in one figure."""
    groups: dict[tuple, list[pd.DataFrame]] = {}
    for sweep in sweeps:
        first = sweep.iloc[0]
        groups.setdefault((first.model, first.max_new_tokens, first.temperature), []).append(sweep)
    return [group for group in groups.values()
            if len({(s.device.iloc[0], s.dtype.iloc[0]) for s in group}) > 1]


def swept_methods(sweep: pd.DataFrame) -> list[str]:
    """The methods (vanilla aside) run at two or more of the sweep's batch sizes, by name (variants together)."""
    counts = sweep.groupby("method").batch_size.nunique()
    return [m for m, n in counts.items() if n > 1 and m != VANILLA]


def batch_sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """A row per method run at two or more batch sizes, a column per batch size: throughput speedup over the
    baseline at that batch size (95% interval) and, under it, `exact` when every question equals its baseline (or
    differs at a numeric tie); a first row with the baseline's own throughput (the median over the runs'
    interleaved baselines) and its gain over batch 1."""
    sizes = sorted(sweep.batch_size.unique())
    baseline_rate = {b: sweep[sweep.batch_size == b].baseline_tokens_per_s.median() for b in sizes}
    rows = [{"Method": "vanilla tok/s", **{f"B={b}": f"{baseline_rate[b]:.1f}" + (
        f" ({baseline_rate[b] / baseline_rate[sizes[0]]:.2f}x)" if b != sizes[0] else "") for b in sizes}}]
    for method in swept_methods(sweep):
        row = {"Method": method}
        for b in sizes:
            hit = sweep[(sweep.method == method) & (sweep.batch_size == b)]
            if hit.empty:
                row[f"B={b}"] = "—"
                continue
            r = hit.iloc[0]
            exact = "" if r.exact_match_or_tie == 1 else f" ≠ ({r.exact_match_or_tie:.2f} exact)"
            row[f"B={b}"] = speedup_text(r.speedup, r.speedup_ci_low, r.speedup_ci_high) + exact
        rows.append(row)
    return pd.DataFrame(rows)


def backend_comparisons(board: pd.DataFrame) -> list[pd.DataFrame]:
    """The overall rows of each group of settings that share model, max_new_tokens and temperature but differ in
    device or dtype (our engine beside a serving engine, CPU beside GPU), where it has two or more."""
    overall = board[board.task == "overall"]
    shared = ["model", "max_new_tokens", "temperature"]
    return [group for _, group in overall.groupby(shared, sort=False, dropna=False)
            if group[["device", "dtype"]].drop_duplicates().shape[0] > 1]


def backend_table(comparison: pd.DataFrame, board: pd.DataFrame) -> pd.DataFrame:
    """A row per setting x method of one comparison: where it ran, its speedup over that setting's own baseline,
    #MAT, the tokens/s of the method and of that baseline, and the tasks it covers; fastest method first."""
    rows = []
    for r in comparison.itertuples():
        tasks = sorted(set(board[(board.setting == r.setting) & (board.method == r.method)].task) - {"overall"})
        rows.append({"Backend": r.device, "dtype": r.dtype, "batch": int(r.batch_size), "Method": r.method,
                     "Speedup": speedup_text(r.speedup, r.speedup_ci_low, r.speedup_ci_high),
                     MAT_COLUMN: "—" if pd.isna(r.mean_accepted_tokens) else f"{r.mean_accepted_tokens:.2f}",
                     "tok/s": r.tokens_per_s, "vanilla tok/s": r.baseline_tokens_per_s,
                     "tasks": ", ".join(tasks)})
    table = pd.DataFrame(rows).sort_values("tok/s", ascending=False, kind="stable").reset_index(drop=True)
    return table.assign(**{c: table[c].map(lambda v: "—" if pd.isna(v) else f"{v:.1f}")
                           for c in ("tok/s", "vanilla tok/s")})


def cost_table(board: pd.DataFrame) -> pd.DataFrame:
    """Per method (overall): measured and predicted speedup, the gap, where its time went, tokens per forward."""
    overall = board[(board.task == "overall") & (board.method != VANILLA)]
    table = pd.DataFrame({
        "method": overall.method,
        "speedup": [speedup_text(*v) for v in zip(overall.speedup, overall.speedup_ci_low, overall.speedup_ci_high)],
        "predicted": overall.predicted_speedup.map(lambda v: "—" if pd.isna(v) else f"{v:.2f}x"),
        "gap": [("—" if pd.isna(g) else f"{g:+.0%}") + (" ⚑" if is_flagged(f) else "")
                for g, f in zip(overall.model_gap, overall.gap_flagged)],
        **{phase: overall[f"{phase}_share"].map(lambda v: "—" if pd.isna(v) else f"{v:.0%}") for phase in PHASES},
        "verified/step": overall.mean_verified_tokens.map(lambda v: "—" if pd.isna(v) else f"{v:.1f}"),
        MAT_COLUMN: overall.mean_accepted_tokens.map(lambda v: f"{v:.2f}"),
        "bound: best fixed k": ["—" if pd.isna(s) else f"{s:.2f}x (k={int(k)})"
                                for k, s in zip(overall.best_fixed_k, overall.best_fixed_k_speedup)],
        "bound: oracle k": overall.oracle_speedup.map(lambda v: "—" if pd.isna(v) else f"{v:.2f}x"),
    })
    return table.iloc[overall.speedup.fillna(-1).argsort()[::-1]].reset_index(drop=True)


def profiles_of(group_runs: pd.DataFrame) -> list[Profile]:
    """The distinct profiles the runs of one setting used."""
    seen, out = set(), []
    for stored in group_runs.profile:
        if stored and json.dumps(stored, sort_keys=True) not in seen:
            seen.add(json.dumps(stored, sort_keys=True))
            out.append(Profile(**stored))
    return out


def coverage_notes(table: pd.DataFrame) -> list[str]:
    """Lines under a wide table saying what its Overall covers where that is not Spec-Bench's six tasks, and which
    rows (†) ran fewer of the table's tasks than others."""
    tasks, headings = table_tasks(table), task_headings(table_tasks(table))
    notes = [] if overall_heading(tasks) == OVERALL_COLUMN else [
        f"{overall_heading(tasks)} is over the tasks run here ({', '.join(headings[t] for t in tasks)}), not "
        f"Spec-Bench's six."]
    return notes + [f"† {r['Method']} ran {len(r['_tasks'])} of the table's {len(tasks)} tasks "
                    f"({', '.join(headings[t] for t in r['_tasks'])}): its Overall covers those only."
                    for r in table.to_dict("records") if r["_partial"]]


def leaderboard_markdown(board: pd.DataFrame) -> str:
    """One setting's Spec-Bench table as leaderboard.md and the docs' generated blocks show it: the formatted wide
    table, the lines on what its Overall covers, the warnings (diverged, starved)."""
    table = wide_table(board)
    return (markdown(formatted(table)) + "".join(f"\n\n{line}" for line in coverage_notes(table))
            + table_warnings(board))


def table_warnings(board: pd.DataFrame) -> str:
    """Markdown paragraphs under one setting's table: methods that differ from their baseline, methods
    timed starved."""
    overall = board[board.task == "overall"]
    diverged = overall[overall.exact_match_or_tie < 1]
    starved = overall[overall.starved.map(is_flagged)]
    return "".join(
        [f"\n\n**{r.method} differs from vanilla beyond numeric ties** (exact_match {r.exact_match:.3f}) on "
         f"questions {r.diverged_questions.replace(';', ', ')}." for r in diverged.itertuples()]
        + [f"\n\n**⚠ {r.method} was timed while starved of CPU** (CPU share {r.cpu_share:.0%}, see "
           f"docs/metrics.md): its speedups are not to be trusted; time it again on a quiet machine."
           for r in starved.itertuples()])


def acceptance_table(board: pd.DataFrame) -> pd.DataFrame:
    """Per drafting method (overall): the acceptance aggregates and the acceptance rate at each draft position."""
    overall = board[(board.task == "overall") & (board.method != VANILLA)]
    return overall[["method", *AGGREGATE_COLUMNS, *POSITION_COLUMNS]].sort_values(
        "mean_accepted_tokens", ascending=False, kind="stable").reset_index(drop=True)


def acceptance_text(table: pd.DataFrame) -> pd.DataFrame:
    """acceptance_table as displayed: its headings, shares as percentages, — where a source cannot tell."""
    def text(column: str, value) -> str:
        if pd.isna(value):
            return "—"
        if column == "draft_k":
            return str(int(value))
        return f"{value:.0%}" if column in ("draft_acceptance_rate", "steps_without_draft_share") else f"{value:.3f}"

    shown = pd.DataFrame({"method": table.method})
    for column in [*AGGREGATE_COLUMNS, *POSITION_COLUMNS]:
        shown[AGGREGATE_COLUMNS.get(column, column)] = [text(column, v) for v in table[column]]
    return shown


def rank_note(table: pd.DataFrame) -> str:
    """A line where #MAT over all steps (Spec-Bench's, pooled as vLLM and SGLang pool it) and the mean over requests
    (SpecForge's) order two methods differently, naming each such pair; '' where they agree."""
    rows = table.dropna(subset=["mean_accepted_tokens", "mean_accepted_tokens_per_request"]).to_dict("records")
    flips = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]
             if (a["mean_accepted_tokens"] - b["mean_accepted_tokens"])
             * (a["mean_accepted_tokens_per_request"] - b["mean_accepted_tokens_per_request"]) < 0]
    if not flips:
        return ""
    pairs = "; ".join(f"{a['method']} {a['mean_accepted_tokens']:.2f} vs {b['method']} "
                      f"{b['mean_accepted_tokens']:.2f} over all steps, {a['mean_accepted_tokens_per_request']:.2f} "
                      f"vs {b['mean_accepted_tokens_per_request']:.2f} per request" for a, b in flips)
    return (f"The two aggregates rank methods differently here: {pairs}. Pooled over steps, long requests weigh "
            f"more; per request, every request counts once (docs/metrics.md).")


def acceptance_by(runs: pd.DataFrame, labels: dict, key: str, edges: tuple[int, ...]) -> pd.DataFrame:
    """Per drafting method, mean tokens per decode step (accepted drafts + 1) over its steps binned by `key`
    (`context`: cached tokens when the step drafted; `position`: tokens decoded before it in its answer), with
    the steps counted: `1.85 (120)`; — for an empty bin."""
    steps: dict[str, list[dict]] = {}
    for row in runs[~runs.is_baseline].itertuples():
        steps.setdefault(labels[row.setting, row.method_config], []).extend(step_table([row.record]))
    columns = bin_labels(edges)
    out = []
    for method, rows in steps.items():
        binned: dict[str, list[int]] = {}
        for step in rows:
            binned.setdefault(bin_label(step[key], edges), []).append(step["accepted"] + 1)
        out.append({"method": method, **{c: f"{sum(binned[c]) / len(binned[c]):.2f} ({len(binned[c])})"
                                         if c in binned else "—" for c in columns}})
    return pd.DataFrame(out, columns=["method", *columns])
