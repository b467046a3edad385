"""`python -m bench.report <results_dir> --out <folder>`: a Spec-Bench style leaderboard, tables and plots of every run.

Reads every run folder under results_dir (answers.jsonl + meta.json, with baseline.jsonl when the method was not
vanilla) into one DataFrame of answer records, keeps per setting, method and task the most recent run, and
recomputes every number from the answers with bench.metrics (never by averaging the runs' summary.csv rows).
Runs of different settings (model, device, dtype, max_new_tokens, temperature, batch size) go into separate tables;
settings that differ only in batch size also get a batch-size sweep: throughput speedup per method and batch size.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

from bench import method_label
from bench.contention import DEFAULT_STARVATION_THRESHOLD
from bench.costmodel import Profile
from bench.engine import PHASES
from bench.metrics import ACCEPT_POSITIONS, decode_step_accepts, speedup_text, summarize
from bench.records import read_jsonl
from tasks import task_of

TASK_COLUMNS = {  # Spec-Bench's leaderboard headings, in its order
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}
MAT_COLUMN, OVERALL_COLUMN = "#Mean Accepted Tokens", "Overall"
ENERGY_COLUMN = "J/token"  # GPU energy per generated token (NVML); only in tables whose runs measured it
ENERGY_COLUMNS = ["joules_per_token", "baseline_joules_per_token"]
SETTING = ["model", "device", "device_name", "dtype", "max_new_tokens", "temperature", "batch_size"]
POSITION_COLUMNS = [f"accept_rate_pos{k}" for k in range(1, ACCEPT_POSITIONS + 1)]
SHARE_COLUMNS = [f"{phase}_share" for phase in PHASES]
COST_COLUMNS = ["predicted_speedup", "model_gap", "gap_flagged", "mean_verified_tokens", *SHARE_COLUMNS]
VANILLA = "vanilla"
PLOT_PREFIXES = ["speedup_by_task", "speedup_vs_mat", "accept_hist", "accept_by_position", "predicted_vs_measured",
                 "forward_time", "batch_sweep"]


# --- loading -------------------------------------------------------------------------------------------------------

def by_question(records: list[dict], run_key: str | None = None) -> dict[int, dict]:
    """The last record per question_id, of `run_key` only when given."""
    return {r["question_id"]: r for r in records if run_key is None or r.get("run_key") == run_key}


def current_baselines(records: list[dict], run_key: str | None) -> dict[int, dict]:
    """baseline.jsonl is not strict: it may keep vanilla records of earlier settings. Keeps the run's key's records:
    meta.json's baseline_run_key where the run recorded it, else the key of the most recently written record."""
    if run_key is None and records:
        run_key = max(records, key=lambda r: r.get("tstamp", 0)).get("run_key")
    return by_question(records, run_key) if records else {}


def find_runs(root: Path) -> list[Path]:
    """Every folder under root (root included) holding a run's answers.jsonl and meta.json."""
    return sorted(p.parent for p in Path(root).rglob("answers.jsonl") if (p.parent / "meta.json").exists())


def run_setting(meta: dict) -> dict:
    config = meta.get("config", {})
    return {
        "model": config.get("model", {}).get("name"),
        "device": meta.get("device"),
        "device_name": meta.get("device_name"),
        "dtype": meta.get("dtype"),
        "max_new_tokens": config.get("gen", {}).get("max_new_tokens"),
        "temperature": float(config.get("gen", {}).get("temperature", 0.0)),
        "batch_size": int(config.get("gen", {}).get("batch_size", 1)),
    }


def load_runs(root: Path) -> pd.DataFrame:
    """One row per answer record of every run under root, with the run's setting, metadata and paired baseline."""
    rows = []
    for run_dir in find_runs(root):
        meta = json.loads((run_dir / "meta.json").read_text())
        config = meta.get("config", {})
        method_cfg = config.get("method", {})
        method = method_label(method_cfg.get("name") or "unknown", method_cfg.get("budget"),
                              method_cfg.get("batch_policy"))
        answers = by_question(read_jsonl(run_dir / "answers.jsonl"))
        is_vanilla = method_cfg.get("drafter") is None
        baselines = answers if is_vanilla else \
            current_baselines(read_jsonl(run_dir / "baseline.jsonl"), meta.get("baseline_run_key"))
        setting = run_setting(meta)
        run_info = {
            "run_dir": str(run_dir),
            "finished": meta.get("finished") or meta.get("started") or "",
            "setting": json.dumps(setting, sort_keys=True),
            **setting,
            "torch": meta.get("torch"),
            "transformers": meta.get("transformers"),
            "git_commit": meta.get("git_commit"),
            "host": meta.get("host"),
            "limit": config.get("task", {}).get("limit"),
            "starvation_threshold": config.get("starvation_threshold", DEFAULT_STARVATION_THRESHOLD),
            "method": method,
            "is_vanilla": is_vanilla,
            "method_config": json.dumps(method_cfg, sort_keys=True, default=str),
            "profile": meta.get("profile"),
        }
        for record in answers.values():
            rows.append({**run_info, "task": task_of(record["category"]), "question_id": record["question_id"],
                         "record": record, "baseline": baselines.get(record["question_id"])})
    columns = ["run_dir", "finished", "setting", *SETTING, "torch", "transformers", "git_commit", "host", "limit",
               "starvation_threshold", "method", "is_vanilla", "method_config", "profile", "task", "question_id",
               "record", "baseline"]
    return pd.DataFrame(rows, columns=columns)


def select_latest(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting, method variant and task, only the records of the most recent run that has that task
    (so task=qa then task=rag runs combine, and a newer per-task run replaces that task of an older task=all run)."""
    if runs.empty:
        return runs
    keys = ["setting", "method_config", "task"]
    order = runs[keys + ["finished", "run_dir"]].drop_duplicates().sort_values(["finished", "run_dir"])
    latest = order.groupby(keys).tail(1)[keys + ["run_dir"]]
    return runs.merge(latest, on=keys + ["run_dir"], how="inner")


# --- the leaderboard -----------------------------------------------------------------------------------------------

def _flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def method_labels(runs: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(setting, method_config) -> row label: the method name, plus the knobs that differ when one setting holds
    several configurations of the same method (a sweep over pld.drafter.num_pred_tokens, say)."""
    labels = {}
    variants = runs[["setting", "method", "method_config"]].drop_duplicates()
    for _, group in variants.groupby(["setting", "method"]):
        configs = {c: _flatten(json.loads(c)) for c in group.method_config}
        differing = sorted({k for flat in configs.values() for k in flat
                            if len({json.dumps(f.get(k), default=str) for f in configs.values()}) > 1})
        for _, row in group.iterrows():
            flat = configs[row.method_config]
            knobs = ", ".join(f"{k.removeprefix('drafter.')}={flat.get(k)}" for k in differing)
            labels[row.setting, row.method_config] = f"{row.method} ({knobs})" if knobs else row.method
    return labels


def _exactness(records: list[dict]) -> tuple[float, str]:
    """Fraction of questions equal to vanilla or differing only at a numeric tie; the ids of the others."""
    judged = [r for r in records if r.get("exact_match") is not None]
    bad = [r["question_id"] for r in judged
           if not r["exact_match"] and not (r.get("divergence") or {}).get("numeric_tie")]
    return ((len(judged) - len(bad)) / len(judged) if judged else math.nan), ";".join(map(str, sorted(bad)))


def leaderboard(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per setting x method x task (and `overall`) with bench.metrics' numbers, from the latest runs.

    A question's vanilla reference is the one decoded interleaved in the method's own run; a run made with
    baseline=false falls back to the latest vanilla run of the same setting, as Spec-Bench pairs two files.
    """
    if runs.empty:
        return board_of(runs, {})
    latest = select_latest(runs)
    return board_of(latest, method_labels(latest))


def board_of(latest: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """leaderboard() of runs already reduced by select_latest, with their method_labels."""
    columns = ["setting", *SETTING, "method", "task", "n_questions", "new_tokens", "tokens_per_s",
               "baseline_tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high", "mean_accepted_tokens",
               "exact_match", "numeric_ties", "exact_match_or_tie", "diverged_questions", "cpu_share", "starved",
               *POSITION_COLUMNS, *COST_COLUMNS, *ENERGY_COLUMNS, "n_tasks", "torch", "transformers", "finished",
               "runs"]
    if latest.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for setting, group in latest.groupby("setting", sort=False):
        values = group.iloc[0][SETTING].to_dict()
        vanilla = {row.question_id: row.record for row in group[group.is_vanilla].itertuples()}
        for method_config, rows in group.groupby("method_config", sort=False):
            label = labels[setting, method_config]
            records = list(rows.record)
            own = {row.question_id: row.baseline for row in rows.itertuples() if row.baseline is not None}
            stored = next((p for p in rows.profile if p), None)  # the profile the run used, from its meta.json
            summary = summarize(label, records, {**vanilla, **own}, starvation_threshold=rows.starvation_threshold.max(),
                                profile=Profile(**stored) if stored else None)
            for _, row in summary.iterrows():
                chosen = rows if row.task == "overall" else rows[rows.task == row.task]
                exact, diverged = _exactness(list(chosen.record))
                out.append({"setting": setting, **values, **row.to_dict(), "exact_match_or_tie": exact,
                            "diverged_questions": diverged, "n_tasks": rows.task.nunique(),
                            "torch": ",".join(sorted(set(map(str, chosen.torch)))),
                            "transformers": ",".join(sorted(set(map(str, chosen.transformers)))),
                            "finished": chosen.finished.max(), "runs": ";".join(sorted(set(chosen.run_dir)))})
    return pd.DataFrame(out, columns=columns)


def task_headings(tasks) -> dict[str, str]:
    """Column headings: Spec-Bench's six tasks in its order, then any other task among `tasks` (custom tasks,
    headed by their name), alphabetically."""
    custom = sorted(set(tasks) - set(TASK_COLUMNS) - {"overall"})
    return {**TASK_COLUMNS, **{task: task for task in custom}}


def wide_table(board: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench's layout for one setting: a row per method, speedup per task, #MAT, overall; best overall first.
    Hidden columns: `_intervals` (heading -> (low, high)), `_partial` (lacks some tasks), `_starved`."""
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
        if "joules_per_token" in board and board.joules_per_token.notna().any():
            row[ENERGY_COLUMN] = overall.joules_per_token
        row["_intervals"], row["_partial"] = intervals, any(t not in by_task.index for t in all_tasks)
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


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """The wide table as displayed: `1.23x (1.10-1.37)` speedups with their interval, 2-decimal #MAT, † on a
    method that lacks some tasks, ⚠ on one timed while starved of CPU."""
    shown = pd.DataFrame({"Method": table.Method})
    for heading in [c for c in table.columns if not c.startswith("_") and c != "Method"]:
        if heading in (MAT_COLUMN, ENERGY_COLUMN):
            digits = 2 if heading == MAT_COLUMN else 3
            shown[heading] = table[heading].map(lambda v: "—" if math.isnan(v) else f"{v:.{digits}f}")
        else:
            shown[heading] = [speedup_text(v, *intervals[heading]) for v, intervals in
                              zip(table[heading], table._intervals)]
    shown[OVERALL_COLUMN] += [(" †" if partial else "") + (" ⚠" if starved else "") for partial, starved in
                              zip(table._partial, table._starved)]
    return shown


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
    }


def slug(board: pd.DataFrame, taken: set[str]) -> str:
    """A file-name part naming one setting (model-device-dtype-Ntok), unique among `taken`."""
    first = board.iloc[0].to_dict()
    parts = [first["model"], str(first["device"]).split(":")[0], first["dtype"], f"{first['max_new_tokens']}tok"]
    if float(first["temperature"]) != 0:
        parts.append(f"t{float(first['temperature']):g}")
    if int(first.get("batch_size", 1)) > 1:
        parts.append(f"b{int(first['batch_size'])}")
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(map(str, parts)))
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


# --- plots ---------------------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(ax, title: str) -> None:
    """A plot's title, wrapped at draw time so that it stays inside the figure however few bars it has."""
    ax.set_title(title, fontsize=9, wrap=True)


def _save(fig, path: Path) -> None:
    """Lay out, write and close a figure (closing matters: reports draw many figures in one process)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_speedup_by_task(board: pd.DataFrame, path: Path, title: str) -> None:
    """Grouped bars, a group per task (and overall), a bar per method with its 95% interval as an error bar, and
    the vanilla = 1.0 line."""
    plt = _pyplot()
    drafted = board[board.method != VANILLA]
    headings = {**task_headings(drafted.task), "overall": OVERALL_COLUMN}
    tasks = [t for t in headings if t in set(drafted.task)]
    methods = list(wide_table(drafted).Method) if not drafted.empty else []
    fig, ax = plt.subplots(figsize=(min(13.0, 3.0 + (0.5 + 0.22 * len(methods)) * len(tasks)), 4.5))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        rows = drafted[drafted.method == method].set_index("task").reindex(tasks)
        xs = [t + (i - (len(methods) - 1) / 2) * width for t in range(len(tasks))]
        errors = [(rows.speedup - rows.speedup_ci_low).fillna(0), (rows.speedup_ci_high - rows.speedup).fillna(0)]
        ax.bar(xs, rows.speedup, width, yerr=errors, capsize=3, error_kw={"linewidth": 1}, label=method)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="vanilla (1.0x)")
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([headings[t].replace(" ", "\n", 1) for t in tasks], fontsize=8)
    ax.set_ylabel("speedup over vanilla (tokens/s ratio)\nbars: 95% interval over questions", fontsize=9)
    _title(ax, title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)


def plot_speedup_vs_mat(table: pd.DataFrame, path: Path, title: str) -> None:
    """One labelled point per method: overall speedup (with its 95% interval) against mean accepted tokens per
    target forward."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    lows, highs = zip(*(intervals[OVERALL_COLUMN] for intervals in table._intervals)) if len(table) else ((), ())
    errors = [(table[OVERALL_COLUMN] - lows).fillna(0), (highs - table[OVERALL_COLUMN]).fillna(0)]
    ax.errorbar(table[MAT_COLUMN], table[OVERALL_COLUMN], yerr=errors, fmt="o", capsize=3, zorder=3)
    for method, mat, speedup in zip(table.Method, table[MAT_COLUMN], table[OVERALL_COLUMN]):
        ax.annotate(method, (mat, speedup), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xlabel("mean accepted tokens per target forward (#MAT)")
    ax.set_ylabel("overall speedup over vanilla")
    _title(ax, title)
    ax.grid(alpha=0.3)
    _save(fig, path)


def accept_lengths_by_method(runs: pd.DataFrame, labels: dict) -> dict[str, list[int]]:
    """Tokens added per decode step (accepted draft tokens + the target's own), prefill steps left out."""
    out: dict[str, list[int]] = {}
    for row in runs.itertuples():
        label = labels[row.setting, row.method_config]
        if not row.is_vanilla:
            out.setdefault(label, []).extend(a + 1 for a in decode_step_accepts(row.record))
    return out


def plot_accept_histogram(lengths: dict[str, list[int]], path: Path, title: str) -> None:
    """A panel per method: the share of decode steps that added 1, 2, 3, ... tokens."""
    plt = _pyplot()
    methods = list(lengths)
    cols = min(3, max(len(methods), 1))
    rows = max(1, math.ceil(len(methods) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    top = max((max(v) for v in lengths.values() if v), default=1)
    for ax, method in zip(axes.flat, methods):
        values = lengths[method]
        counts = pd.Series(values).value_counts(normalize=True).reindex(range(1, top + 1), fill_value=0)
        ax.bar(counts.index, counts.values, color="tab:blue")
        mean = sum(values) / len(values) if values else math.nan
        ax.set_title(f"{method} ({len(values)} decode steps, mean {mean:.2f})", fontsize=9)
        ax.set_xlabel("tokens per decode step", fontsize=8)
        ax.set_ylabel("share of steps", fontsize=8)
        ax.set_xticks(range(1, top + 1))
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    if not methods:
        axes.flat[0].text(0.5, 0.5, "no drafting method in these runs", ha="center", va="center")
    fig.suptitle(title, fontsize=9, wrap=True)
    _save(fig, path)


def plot_accept_by_position(acceptance: pd.DataFrame, path: Path, title: str) -> None:
    """Acceptance rate at draft positions 1..5 (share of decode steps accepting at least k draft tokens)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    positions = list(range(1, ACCEPT_POSITIONS + 1))
    for row in acceptance.itertuples(index=False):
        ax.plot(positions, [getattr(row, c) for c in POSITION_COLUMNS], marker="o", label=row.method)
    ax.set_xticks(positions)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("share of decode steps accepting ≥ k draft tokens")
    _title(ax, title)
    ax.grid(alpha=0.3)
    if len(acceptance):
        ax.legend(fontsize=8)
    _save(fig, path)


# --- batch-size sweeps ----------------------------------------------------------------------------------------------

def batch_sweeps(board: pd.DataFrame) -> list[pd.DataFrame]:
    """The overall rows of each group of settings that differ only in batch size, where it has two or more."""
    overall = board[board.task == "overall"]
    if overall.empty:
        return []
    unbatched = [c for c in SETTING if c != "batch_size"]
    return [group for _, group in overall.groupby(unbatched, sort=False, dropna=False) if group.batch_size.nunique() > 1]


def swept_methods(sweep: pd.DataFrame) -> list[str]:
    """The methods (vanilla aside) run at two or more of the sweep's batch sizes, by name (variants together)."""
    counts = sweep.groupby("method").batch_size.nunique()
    return [m for m, n in counts.items() if n > 1 and m != VANILLA]


def batch_sweep_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """A row per method run at two or more batch sizes, a column per batch size: throughput speedup over vanilla at that batch size (95% interval)
    and, under it, `exact` when every question equals vanilla (or differs at a numeric tie); a first row with
    vanilla's own throughput (the median over the runs' interleaved baselines) and its gain over batch 1."""
    sizes = sorted(sweep.batch_size.unique())
    vanilla_rate = {b: sweep[sweep.batch_size == b].baseline_tokens_per_s.median() for b in sizes}
    rows = [{"Method": "vanilla tok/s", **{f"B={b}": f"{vanilla_rate[b]:.1f}" + (
        f" ({vanilla_rate[b] / vanilla_rate[sizes[0]]:.2f}x)" if b != sizes[0] else "") for b in sizes}}]
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


def plot_batch_sweep(sweep: pd.DataFrame, path: Path, title: str) -> None:
    """Throughput speedup over vanilla at the same batch size against batch size, a line per method with its 95%
    intervals, and the vanilla = 1.0 line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for method, rows in sweep[sweep.method.isin(swept_methods(sweep))].groupby("method", sort=False):
        rows = rows.sort_values("batch_size")
        errors = [rows.speedup - rows.speedup_ci_low, rows.speedup_ci_high - rows.speedup]
        ax.errorbar(rows.batch_size, rows.speedup, yerr=None if rows.speedup_ci_low.isna().all() else errors,
                    marker="o", capsize=3, label=method)
    sizes = sorted(sweep.batch_size.unique())
    ax.plot(sizes, [1.0] * len(sizes), color="black", linestyle="--", linewidth=1, label="vanilla")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (sequences decoded at once)")
    ax.set_ylabel("throughput speedup over vanilla at that batch size")
    _title(ax, title)
    ax.legend(fontsize=8)
    _save(fig, path)


BATCH_NOTES = (
    "Throughput speedup = the method's generated tokens/s over its batches / vanilla's, vanilla decoded in the same "
    "batches interleaved with the method (batch 1: the usual per-question speedup); 95% interval from a paired "
    "bootstrap over questions. The first row is vanilla's own throughput and its gain over the smallest batch."
)


# --- writing -------------------------------------------------------------------------------------------------------

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
    })
    return table.iloc[overall.speedup.fillna(-1).argsort()[::-1]].reset_index(drop=True)


COST_NOTES = (
    "Predicted = the speedup the target's forward-time profile (python -m bench.profile) predicts from the run's own "
    "steps: each decode step costs t(verified tokens, context) plus the drafting time measured; vanilla t(1) per "
    "token. Gap = measured / predicted - 1; ⚑ where the prediction lies outside the measured 95% interval: time "
    "spent outside drafting and the target's forward (acceptance, cache compaction, masks, Python). prefill / draft "
    "/ verify / accept = share of the method's generation time in each engine phase; verified/step = tokens per "
    "verification forward (root + draft nodes + auxiliary)."
)


def profiles_of(group_runs: pd.DataFrame) -> list[Profile]:
    """The distinct profiles the runs of one setting used."""
    seen, out = set(), []
    for stored in group_runs.profile:
        if stored and json.dumps(stored, sort_keys=True) not in seen:
            seen.add(json.dumps(stored, sort_keys=True))
            out.append(Profile(**stored))
    return out


def plot_forward_time(profile: Profile, path: Path, title: str) -> None:
    """t(L) / t(1) against L, one line per measured context length: what verifying L tokens costs here."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for context, row in zip(profile.contexts, profile.seconds):
        ax.plot(profile.lengths, [s / row[0] for s in row], marker="o", label=f"context {context}")
    ax.plot(profile.lengths, [1.0] * len(profile.lengths), color="black", linestyle="--", linewidth=1,
            label="free verification")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens verified in one forward (L)")
    ax.set_ylabel("t(L) / t(1)")
    _title(ax, f"{title}\nforward time, threads {profile.setting.get('threads')}")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_predicted_vs_measured(board: pd.DataFrame, path: Path, title: str) -> None:
    """One labelled point per method: predicted (x) against measured (y) overall speedup, with y = x."""
    plt = _pyplot()
    overall = board[(board.task == "overall") & (board.method != VANILLA)].dropna(subset=["predicted_speedup"])
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for row in overall.itertuples():
        errors = [[row.speedup - row.speedup_ci_low], [row.speedup_ci_high - row.speedup]]
        ax.errorbar(row.predicted_speedup, row.speedup, yerr=None if pd.isna(row.speedup_ci_low) else errors,
                    fmt="o", capsize=3)
        ax.annotate(row.method, (row.predicted_speedup, row.speedup), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    values = [*overall.predicted_speedup, *overall.speedup, 1.0]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], color="black", linestyle="--", linewidth=1, label="measured = predicted")
    ax.set_xlabel("predicted speedup (profile x the run's steps)")
    ax.set_ylabel("measured speedup (95% interval)")
    _title(ax, title)
    ax.legend(fontsize=8)
    _save(fig, path)


NOTES = (
    "Speedup = mean tokens/s of the method over a task's questions / the same for vanilla on the same questions "
    "(vanilla decoded interleaved in the method's run); in brackets its 95% interval from a paired bootstrap over "
    "questions (none for a single question). Overall is recomputed over all of a method's questions, not "
    "averaged over tasks. #Mean Accepted Tokens = generated tokens / target forwards (vanilla 1.00); it has no "
    "interval because under greedy decoding it is deterministic (the same tokens and forwards every run). "
    "† the method has no run for some of the table's tasks: its Overall covers the others only. "
    "⚠ the method was timed while starved of CPU (its process had less of the CPU than its threads could use): "
    "its speedups are not to be trusted. J/token (GPU runs with NVML only) = the device's energy while the "
    "method decoded / its generated tokens, all tasks together."
)


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def table_warnings(board: pd.DataFrame) -> str:
    """Markdown paragraphs under one setting's table: methods that differ from vanilla, methods timed starved."""
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
    overall = board[(board.task == "overall") & (board.method != VANILLA)]
    return overall[["method", *POSITION_COLUMNS, "mean_accepted_tokens"]].sort_values(
        "mean_accepted_tokens", ascending=False, kind="stable").reset_index(drop=True)


def write_report(results_dir: Path, out: Path) -> pd.DataFrame:
    """Everything `python -m bench.report` writes; returns the long leaderboard DataFrame."""
    runs = load_runs(results_dir)
    if runs.empty:
        raise SystemExit(f"error: no runs (answers.jsonl + meta.json) under {results_dir}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [p for prefix in PLOT_PREFIXES for p in out.glob(f"{prefix}-*.png")]:  # of an earlier report
        stale.unlink()
    latest = select_latest(runs)
    labels = method_labels(latest)
    board = board_of(latest, labels)
    flat = board.drop(columns="setting")
    flat.to_csv(out / "leaderboard.csv", index=False)
    flat.to_parquet(out / "leaderboard.parquet", index=False)

    md = ["# Speculative decoding leaderboard", "", NOTES, "", COST_NOTES, ""]
    acc_md = ["# Acceptance rate by draft position", "",
              "Share of decode steps (prefill steps left out) that accepted at least k drafted tokens.", ""]
    page, acceptance_rows, taken = [], [], set()
    for setting, group in board.groupby("setting", sort=False):
        group_runs = latest[latest.setting == setting]
        facts = setting_facts(group, group_runs)
        name = slug(group, taken)
        title = f"{facts['model']} · {facts['device']} · {facts['dtype']} · max_new_tokens {facts['max_new_tokens']}"
        if facts["batch size"] != "1":
            title += f" · batch {facts['batch size']}"
        table = wide_table(group)
        shown = formatted(table)
        warning = table_warnings(group)
        acceptance = acceptance_table(group)
        acceptance_rows.append(acceptance.assign(**group.iloc[0][SETTING].to_dict()))
        plots = {
            "speedup by task": f"speedup_by_task-{name}.png",
            "speedup vs mean accepted tokens": f"speedup_vs_mat-{name}.png",
            "tokens per decode step": f"accept_hist-{name}.png",
            "acceptance by draft position": f"accept_by_position-{name}.png",
        }
        plot_speedup_by_task(group, out / plots["speedup by task"], title)
        plot_speedup_vs_mat(table, out / plots["speedup vs mean accepted tokens"], title)
        lengths = accept_lengths_by_method(group_runs, labels)
        lengths = {m: lengths[m] for m in table.Method if m in lengths}  # in the leaderboard's order
        plot_accept_histogram(lengths, out / plots["tokens per decode step"], title)
        plot_accept_by_position(acceptance, out / plots["acceptance by draft position"], title)
        costs = cost_table(group)
        cost_plots = {}
        if group.predicted_speedup.notna().any():
            cost_plots["predicted vs measured speedup"] = f"predicted_vs_measured-{name}.png"
            plot_predicted_vs_measured(group, out / cost_plots["predicted vs measured speedup"], title)
        for i, profile in enumerate(profiles_of(group_runs)):
            cost_plots[f"forward time t(L)/t(1) ({i + 1})"] = f"forward_time-{name}-{i + 1}.png"
            plot_forward_time(profile, out / cost_plots[f"forward time t(L)/t(1) ({i + 1})"], title)

        header = " · ".join(f"{k}: {v}" for k, v in facts.items())
        md += [f"## {title}", "", header, "", markdown(shown) + warning, "", "### Where the time goes", "",
               markdown(costs), ""]
        shown_acc = acceptance.assign(**{c: acceptance[c].map(lambda v: f"{v:.3f}")
                                         for c in [*POSITION_COLUMNS, "mean_accepted_tokens"]})
        acc_md += [f"## {title}", "", markdown(shown_acc), ""]
        page.append(f"<h2>{html.escape(title)}</h2><p class='facts'>{html.escape(header)}</p>" + _html_table(shown)
                    + (f"<p class='warn'>{html.escape(warning.strip().replace('**', ''))}</p>" if warning else "")
                    + "".join(f"<figure><img src='{html.escape(f)}' alt='{html.escape(k)}'><figcaption>"
                              f"{html.escape(k)}</figcaption></figure>" for k, f in plots.items())
                    + "<h3>Where the time goes</h3>" + _html_table(costs)
                    + "".join(f"<figure><img src='{html.escape(f)}' alt='{html.escape(k)}'><figcaption>"
                              f"{html.escape(k)}</figcaption></figure>" for k, f in cost_plots.items())
                    + "<h3>Acceptance rate by draft position</h3>" + _html_table(shown_acc))

    for sweep in batch_sweeps(board):
        first = sweep.iloc[0].to_dict()
        title = f"{first['model']} · {first['device']} · {first['dtype']} · max_new_tokens {first['max_new_tokens']}"
        name = f"batch_sweep-{slug(sweep.assign(batch_size=1), set())}.png"
        plot_batch_sweep(sweep, out / name, title)
        table = batch_sweep_table(sweep)
        md += [f"## Batch-size sweep: {title}", "", BATCH_NOTES, "", markdown(table), "", f"![batch sweep]({name})", ""]
        page.append(f"<h2>Batch-size sweep: {html.escape(title)}</h2><p>{html.escape(BATCH_NOTES)}</p>"
                    + _html_table(table) + f"<figure><img src='{html.escape(name)}' alt='batch sweep'></figure>")

    (out / "leaderboard.md").write_text("\n".join(md))
    (out / "acceptance.md").write_text("\n".join(acc_md))
    pd.concat(acceptance_rows, ignore_index=True).to_csv(out / "acceptance.csv", index=False)
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}td:first-child,th:first-child"
             "{text-align:left}.facts{color:#444;font-size:90%}.warn{color:#a00}figure{display:inline-block;"
             "margin:0.5em;max-width:100%;vertical-align:top}img{max-width:100%;height:auto}")
    (out / "index.html").write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Speculative decoding leaderboard</title>"
        f"<style>{style}</style></head><body><h1>Speculative decoding leaderboard</h1><p>{html.escape(NOTES)}</p>"
        f"<p>{html.escape(COST_NOTES)}</p>"
        + "".join(page) + "</body></html>\n")
    return board


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="folder searched recursively for runs (e.g. results/runs)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="folder to write the report into")
    args = parser.parse_args(argv)
    write_report(args.results_dir, args.out)
    print((args.out / "leaderboard.md").read_text())
    print(f"report written to {args.out}/ (open {args.out / 'index.html'})", file=sys.stderr)


if __name__ == "__main__":
    main()
