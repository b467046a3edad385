"""The report's plots (matplotlib, drawn off screen): speedup by task, speedup vs #MAT, accepted-token histogram and
positions, forward time, predicted vs measured speedup, batch-size sweeps, the regimes' views."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.measure.metrics import ACCEPT_POSITIONS
from bench.planning.costmodel import Profile
from bench.report.regimes import regime_columns
from bench.report.tables import (
    MAT_COLUMN,
    OVERALL_COLUMN,
    POSITION_COLUMNS,
    VANILLA,
    is_flagged,
    swept_methods,
    task_headings,
    wide_table,
)

PLOT_PREFIXES = ["speedup_by_task", "speedup_vs_mat", "accept_hist", "accept_by_position", "predicted_vs_measured",
                 "forward_time", "batch_sweep", "long_inputs", "temperature", "dtypes"]
MARKERS = "osD^v<>Pp*hX"  # a line per method in the regime panels: colour and marker together tell them apart
MAT_AXIS = "#MAT: tokens per decode step (prefill left out)"  # docs/metrics.md's definition
STARVED_MARK = "⚠"  # on a bar or point timed while starved of CPU, as on the tables


class Palette:
    """One colour and marker per method across every plot of a report: the methods given up front get tab20's
    colours in their sorted order (its ten strong colours first, then their light twins), any other method the next
    free one when first drawn."""

    def __init__(self, methods=()):
        colors = _pyplot().get_cmap("tab20").colors
        self.colors = [*colors[0::2], *colors[1::2]]
        self.styles: dict[str, dict] = {}
        for method in sorted(set(methods) - {VANILLA}):
            self.style(method)

    def style(self, method: str) -> dict:
        """matplotlib keyword arguments giving `method` its colour and marker."""
        if method not in self.styles:
            i = len(self.styles)
            self.styles[method] = {"color": self.colors[i % len(self.colors)], "marker": MARKERS[i % len(MARKERS)]}
        return self.styles[method]

    def color(self, method: str) -> dict:
        """`method`'s colour alone, as keyword arguments (for bars)."""
        return {"color": self.style(method)["color"]}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(ax, title: str) -> None:
    """A plot's title, wrapped at draw time so that it stays inside the figure however few bars it has."""
    ax.set_title(title, fontsize=9, wrap=True)


def _mark_starved(ax, xs, ys, flags) -> None:
    """STARVED_MARK above each (x, y) whose flag is set: a bar or point timed while starved of CPU."""
    for x, y, flagged in zip(xs, ys, flags):
        if flagged and not pd.isna(y):
            ax.annotate(STARVED_MARK, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=10,
                        color="#a00")


def _starved_label(method: str, starved: bool) -> str:
    return f"{method} {STARVED_MARK} starved" if starved else method


def _save(fig, path: Path) -> None:
    """Lay out, write and close a figure (closing matters: reports draw many figures in one process)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_speedup_by_task(board: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """Grouped bars, a group per task (and overall), a bar per method in its palette colour with its 95% interval
    as an error bar, STARVED_MARK over a starved method's bars, and the baseline's 1.0 line."""
    plt = _pyplot()
    drafted = board[board.method != VANILLA]
    palette = palette or Palette(drafted.method)
    headings = {**task_headings(drafted.task), "overall": OVERALL_COLUMN}
    tasks = [t for t in headings if t in set(drafted.task)]
    table = wide_table(drafted) if not drafted.empty else pd.DataFrame({"Method": [], "_starved": []})
    fig, ax = plt.subplots(figsize=(min(13.0, 3.0 + (0.5 + 0.22 * len(table)) * len(tasks)), 4.5))
    width = 0.8 / max(len(table), 1)
    for i, (method, starved) in enumerate(zip(table.Method, table._starved)):
        rows = drafted[drafted.method == method].set_index("task").reindex(tasks)
        xs = [t + (i - (len(table) - 1) / 2) * width for t in range(len(tasks))]
        errors = [(rows.speedup - rows.speedup_ci_low).fillna(0), (rows.speedup_ci_high - rows.speedup).fillna(0)]
        ax.bar(xs, rows.speedup, width, yerr=errors, capsize=3, error_kw={"linewidth": 1},
               label=_starved_label(method, starved), **palette.color(method))
        _mark_starved(ax, xs, rows.speedup_ci_high.fillna(rows.speedup), [starved] * len(xs))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="vanilla (1.0x)")
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([headings[t].replace(" ", "\n", 1) for t in tasks], fontsize=8)
    ax.set_ylabel("speedup over vanilla (tokens/s ratio)\nbars: 95% interval over questions", fontsize=9)
    _title(ax, title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)


def plot_speedup_vs_mat(table: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """One labelled point per method in its palette style: overall speedup (with its 95% interval) against #MAT,
    tokens per decode step; a starved method's point hollow and labelled with STARVED_MARK."""
    plt = _pyplot()
    palette = palette or Palette(table.Method)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for row in table.to_dict("records"):
        method, mat, speedup, (low, high) = row["Method"], row[MAT_COLUMN], row[OVERALL_COLUMN], \
            row["_intervals"][OVERALL_COLUMN]
        style = {"color": "black", "marker": "o"} if method == VANILLA else palette.style(method)
        errors = None if pd.isna(low) else [[speedup - low], [high - speedup]]
        ax.errorbar([mat], [speedup], yerr=errors, capsize=3, zorder=3, linestyle="none", label=method,
                    markerfacecolor="none" if row["_starved"] else style["color"], **style)
        ax.annotate(_starved_label(method, row["_starved"]), (mat, speedup), textcoords="offset points",
                    xytext=(5, 4), fontsize=8)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xlabel(MAT_AXIS)
    ax.set_ylabel("overall speedup over vanilla")
    _title(ax, title)
    ax.grid(alpha=0.3)
    _save(fig, path)


def plot_accept_histogram(lengths: dict[str, list[int]], path: Path, title: str,
                          palette: Palette | None = None) -> None:
    """A panel per method, in its palette colour: the share of decode steps that added 1, 2, 3, ... tokens."""
    plt = _pyplot()
    methods = list(lengths)
    palette = palette or Palette(methods)
    cols = min(3, max(len(methods), 1))
    rows = max(1, math.ceil(len(methods) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    top = max((max(v) for v in lengths.values() if v), default=1)
    for ax, method in zip(axes.flat, methods):
        values = lengths[method]
        counts = pd.Series(values).value_counts(normalize=True).reindex(range(1, top + 1), fill_value=0)
        ax.bar(counts.index, counts.values, label=method, **palette.color(method))
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


def plot_accept_by_position(acceptance: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """Acceptance rate at draft positions 1..5 (share of decode steps accepting at least k draft tokens), a line per
    method in its palette style."""
    plt = _pyplot()
    palette = palette or Palette(acceptance.method)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    positions = list(range(1, ACCEPT_POSITIONS + 1))
    for row in acceptance.itertuples(index=False):
        k = getattr(row, "draft_k", math.nan)
        label = row.method if pd.isna(k) else f"{row.method} (k={int(k)})"  # positions compare at equal k only
        ax.plot(positions, [getattr(row, c) for c in POSITION_COLUMNS], label=label, **palette.style(row.method))
    ax.set_xticks(positions)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("share of decode steps accepting ≥ k draft tokens")
    _title(ax, title)
    ax.grid(alpha=0.3)
    if len(acceptance):
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_batch_sweep(sweep: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """Throughput speedup over the baseline at the same batch size against batch size, a line per method in its
    palette style with its 95% intervals and STARVED_MARK over starved points, and the baseline's 1.0 line."""
    plot_batch_sweeps([sweep], path, title, palette)


def plot_batch_sweeps(sweeps: list[pd.DataFrame], path: Path, title: str, palette: Palette | None = None) -> None:
    """plot_batch_sweep's lines for several sweeps in one figure (our engine's batch sweep beside a serving
    engine's concurrency sweep), each line labelled with its method and, for more than one sweep, its backend
    (a line style per backend)."""
    plt = _pyplot()
    palette = palette or Palette(m for sweep in sweeps for m in swept_methods(sweep))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for sweep, linestyle in zip(sweeps, ["-", ":", "-.", (0, (5, 1))] * len(sweeps)):
        where = f" ({sweep.device.iloc[0]}, {sweep.dtype.iloc[0]})" if len(sweeps) > 1 else ""
        for method, rows in sweep[sweep.method.isin(swept_methods(sweep))].groupby("method", sort=False):
            rows = rows.sort_values("batch_size")
            errors = [rows.speedup - rows.speedup_ci_low, rows.speedup_ci_high - rows.speedup]
            ax.errorbar(rows.batch_size, rows.speedup, yerr=None if rows.speedup_ci_low.isna().all() else errors,
                        capsize=3, label=method + where, linestyle=linestyle, **palette.style(method))
            _mark_starved(ax, rows.batch_size, rows.speedup_ci_high.fillna(rows.speedup), rows.starved.map(is_flagged))
    sizes = sorted({b for sweep in sweeps for b in sweep.batch_size.unique()})
    ax.plot(sizes, [1.0] * len(sizes), color="black", linestyle="--", linewidth=1, label="vanilla")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (sequences decoded at once; a server's concurrency)")
    ax.set_ylabel("throughput speedup over vanilla at that batch size")
    _title(ax, title)
    ax.legend(fontsize=8)
    _save(fig, path)


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


def plot_predicted_vs_measured(board: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """One labelled point per method in its palette style: predicted (x) against measured (y) overall speedup, with
    y = x; a starved method's point labelled with STARVED_MARK."""
    plt = _pyplot()
    overall = board[(board.task == "overall") & (board.method != VANILLA)].dropna(subset=["predicted_speedup"])
    palette = palette or Palette(overall.method)
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for row in overall.itertuples():
        errors = [[row.speedup - row.speedup_ci_low], [row.speedup_ci_high - row.speedup]]
        ax.errorbar(row.predicted_speedup, row.speedup, yerr=None if pd.isna(row.speedup_ci_low) else errors,
                    capsize=3, linestyle="none", **palette.style(row.method))
        ax.annotate(_starved_label(row.method, is_flagged(row.starved)), (row.predicted_speedup, row.speedup),
                    fontsize=8, xytext=(4, 4), textcoords="offset points")
    values = [*overall.predicted_speedup, *overall.speedup, 1.0]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], color="black", linestyle="--", linewidth=1, label="measured = predicted")
    ax.set_xlabel("predicted speedup (profile x the run's steps)")
    ax.set_ylabel("measured speedup (95% interval)")
    _title(ax, title)
    ax.legend(fontsize=8)
    _save(fig, path)


def _regime_panels(lines: dict[str, pd.DataFrame], x_label: str, path: Path, title: str, ticks=None,
                   palette: Palette | None = None) -> None:
    """Two panels against one x (bucket or temperature), a line per method in its palette style: speedup with its
    95% interval and the vanilla 1.0 line, and #MAT with its interval where it has one. `lines`: method -> frame of
    x, speedup, low, high, mat, mat_low, mat_high (NaN where unknown)."""
    plt = _pyplot()
    palette = palette or Palette(lines)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    for method, rows in lines.items():
        style = palette.style(method)
        for ax, (value, low, high) in ((left, ("speedup", "low", "high")), (right, ("mat", "mat_low", "mat_high"))):
            errors = None if rows[low].isna().all() else [(rows[value] - rows[low]).fillna(0),
                                                          (rows[high] - rows[value]).fillna(0)]
            ax.errorbar(rows.x, rows[value], yerr=errors, capsize=3, label=method, **style)
    left.axhline(1.0, color="black", linewidth=1, linestyle="--", label="vanilla (1.0x)")
    left.set_ylabel("speedup over vanilla (95% interval)")
    right.set_ylabel(MAT_AXIS)
    for ax in (left, right):
        ax.set_xlabel(x_label)
        if ticks is not None:
            ax.set_xticks(*ticks)
        ax.grid(alpha=0.3)
    right.legend(*left.get_legend_handles_labels(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title, fontsize=9, wrap=True)
    _save(fig, path)


def plot_buckets(table: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """Speedup and #MAT per input-length bucket (bench.report.regimes.bucket_table), a line per method."""
    buckets = regime_columns(table)
    parts = {"speedup": "speedup", "low": "low", "high": "high", "mat": "#MAT"}
    lines = {row["Method"]: pd.DataFrame({"x": range(len(buckets)), "mat_low": math.nan, "mat_high": math.nan,
                                          **{key: [row[f"{b} {part}"] for b in buckets]
                                             for key, part in parts.items()}})
             for row in table.to_dict("records")}
    _regime_panels(lines, "input-length bucket (prompt tokens at most)", path, title,
                   ticks=(range(len(buckets)), buckets), palette=palette)


def plot_temperature(table: pd.DataFrame, path: Path, title: str, palette: Palette | None = None) -> None:
    """Speedup and #MAT against gen.temperature (bench.report.regimes.temperature_table), a line per method."""
    columns = {"temperature": "x", "speedup": "speedup", "speedup_ci_low": "low", "speedup_ci_high": "high",
               "mean_accepted_tokens": "mat", "mat_ci_low": "mat_low", "mat_ci_high": "mat_high"}
    lines = {method: rows.sort_values("temperature")[list(columns)].rename(columns=columns)
             for method, rows in table.groupby("method", sort=False)}
    _regime_panels(lines, "gen.temperature (0 = greedy)", path, title, palette=palette)


def plot_dtypes(table: pd.DataFrame, path: Path, title: str) -> None:
    """Two panels of grouped bars, a group per method and a bar per dtype (bench.report.regimes.dtype_table):
    overall speedup with its 95% interval and the vanilla 1.0 line, and #MAT."""
    plt = _pyplot()
    dtypes = regime_columns(table)
    drafted = table[table.Method != VANILLA].reset_index(drop=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(min(14.0, 4.0 + 0.9 * len(drafted)), 4.5))
    width = 0.8 / max(len(dtypes), 1)
    for i, dtype in enumerate(dtypes):
        xs = [m + (i - (len(dtypes) - 1) / 2) * width for m in range(len(drafted))]
        speedup = drafted[f"{dtype} speedup"]
        errors = [(speedup - drafted[f"{dtype} low"]).fillna(0), (drafted[f"{dtype} high"] - speedup).fillna(0)]
        left.bar(xs, speedup, width, yerr=errors, capsize=3, error_kw={"linewidth": 1}, label=dtype)
        right.bar(xs, drafted[f"{dtype} #MAT"], width, label=dtype)
    left.axhline(1.0, color="black", linewidth=1, linestyle="--", label="vanilla (1.0x)")
    left.set_ylabel("overall speedup over vanilla (95% interval)", fontsize=9)
    right.set_ylabel(MAT_AXIS, fontsize=9)
    for ax in (left, right):
        ax.set_xticks(range(len(drafted)))
        ax.set_xticklabels(drafted.Method, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=9, wrap=True)
    _save(fig, path)
