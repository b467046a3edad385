"""`python -m bench.report <results_dir> --out <folder>`: a Spec-Bench style leaderboard, tables and plots of every run.

Reads every run folder under results_dir (answers.jsonl + meta.json, with baseline.jsonl when the method was not
vanilla) into one DataFrame of answer records, keeps per setting, method and task the most recent run, and
recomputes every number from the answers with bench/measure/metrics.py (never by averaging the runs' summary.csv rows).
Runs of different settings (model, device, dtype, max_new_tokens, temperature, batch size) go into separate tables;
settings that differ only in batch size also get a batch-size sweep: throughput speedup per method and batch size.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd

from bench.report.plots import (
    PLOT_PREFIXES,
    plot_accept_by_position,
    plot_accept_histogram,
    plot_batch_sweep,
    plot_batch_sweeps,
    plot_buckets,
    plot_dtypes,
    plot_forward_time,
    plot_predicted_vs_measured,
    plot_speedup_by_task,
    plot_speedup_vs_mat,
    plot_temperature,
)
from bench.report.regimes import (
    bucket_table,
    bucket_tasks,
    bucket_text,
    dtype_groups,
    dtype_table,
    dtype_text,
    temperature_sweeps,
    temperature_table,
    temperature_text,
)
from bench.report.runs import SETTING_COLUMNS, load_runs, method_labels, select_latest
from bench.report.tables import (
    POSITION_COLUMNS,
    accept_lengths_by_method,
    acceptance_table,
    backend_comparisons,
    backend_table,
    batch_sweep_table,
    batch_sweeps,
    board_of,
    cost_table,
    formatted,
    markdown,
    profiles_of,
    setting_facts,
    sweeps_across_backends,
    table_warnings,
    wide_table,
)


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


BATCH_NOTES = (
    "Throughput speedup = the method's generated tokens/s over its batches / vanilla's, vanilla decoded in the same "
    "batches interleaved with the method (batch 1: the usual per-question speedup); 95% interval from a paired "
    "bootstrap over questions. The first row is vanilla's own throughput and its gain over the smallest batch."
)


BACKEND_NOTES = (
    "Each setting's overall row side by side: the speedup is over that setting's own vanilla (decoded interleaved in "
    "the same run), so rows of different backends are not paired with each other. batch: the batch size, or a "
    "server's concurrency. tok/s: the runs' mean tokens/s per question (per request at that batch or concurrency; "
    "absolute, from separate runs: compare them only between runs timed on the same quiet machine)."
)


COST_NOTES = (
    "Predicted = the speedup the target's forward-time profile (python -m bench.profile) predicts from the run's own "
    "steps: each decode step costs t(verified tokens, context) plus the drafting time measured; vanilla t(1) per "
    "token. Gap = measured / predicted - 1; ⚑ where the prediction lies outside the measured 95% interval: time "
    "spent outside drafting and the target's forward (acceptance, cache compaction, masks, Python). prefill / draft "
    "/ verify / accept = share of the method's generation time in each engine phase; verified/step = tokens per "
    "verification forward (root + draft nodes + auxiliary)."
)


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
        section = setting_section(out, group, latest[latest.setting == setting], labels, taken)
        md += section["md"]
        acc_md += section["acceptance_md"]
        page.append(section["html"])
        acceptance_rows.append(section["acceptance"])
    sweeps = batch_sweeps(board)
    for sweep in sweeps:
        sweep_md, sweep_html = sweep_section(out, sweep)
        md += sweep_md
        page.append(sweep_html)
    for together in sweeps_across_backends(sweeps):
        sweep_md, sweep_html = sweeps_across_section(out, together)
        md += sweep_md
        page.append(sweep_html)
    for comparison in backend_comparisons(board):
        table, first = backend_table(comparison, board), comparison.iloc[0]
        title = f"Across backends: {first['model']} · max_new_tokens {first['max_new_tokens']}"
        md += [f"## {title}", "", BACKEND_NOTES, "", markdown(table), ""]
        page.append(f"<h2>{html.escape(title)}</h2><p>{html.escape(BACKEND_NOTES)}</p>" + _html_table(table))

    regime_md, regime_html = regime_sections(out, board, runs)
    md += regime_md
    page += regime_html

    (out / "leaderboard.md").write_text("\n".join(md))
    (out / "acceptance.md").write_text("\n".join(acc_md))
    pd.concat(acceptance_rows, ignore_index=True).to_csv(out / "acceptance.csv", index=False)
    (out / "index.html").write_text(html_page(page))
    return board


def setting_section(out: Path, group: pd.DataFrame, group_runs: pd.DataFrame, labels: dict, taken: set[str]) -> dict:
    """One setting's part of the report (its plots written to `out`): Markdown lines of the leaderboard and of the
    acceptance page, its HTML, and its acceptance rows (with the setting's columns)."""
    facts = setting_facts(group, group_runs)
    name = slug(group, taken)
    title = f"{facts['model']} · {facts['device']} · {facts['dtype']} · max_new_tokens {facts['max_new_tokens']}"
    if facts["batch size"] != "1":
        title += f" · batch {facts['batch size']}"
    table = wide_table(group)
    shown = formatted(table)
    warning = table_warnings(group)
    acceptance = acceptance_table(group)
    plots, cost_plots = setting_plots(out, group, group_runs, labels, table, acceptance, name, title)
    costs = cost_table(group)
    header = " · ".join(f"{k}: {v}" for k, v in facts.items())
    shown_acc = acceptance.assign(**{c: acceptance[c].map(lambda v: f"{v:.3f}")
                                     for c in [*POSITION_COLUMNS, "mean_accepted_tokens"]})
    page = (f"<h2>{html.escape(title)}</h2><p class='facts'>{html.escape(header)}</p>" + _html_table(shown)
            + (f"<p class='warn'>{html.escape(warning.strip().replace('**', ''))}</p>" if warning else "")
            + _html_figures(plots) + "<h3>Where the time goes</h3>" + _html_table(costs) + _html_figures(cost_plots)
            + "<h3>Acceptance rate by draft position</h3>" + _html_table(shown_acc))
    return {"md": [f"## {title}", "", header, "", markdown(shown) + warning, "", "### Where the time goes", "",
                   markdown(costs), ""],
            "acceptance_md": [f"## {title}", "", markdown(shown_acc), ""], "html": page,
            "acceptance": acceptance.assign(**group.iloc[0][SETTING_COLUMNS].to_dict())}


def setting_plots(out: Path, group: pd.DataFrame, group_runs: pd.DataFrame, labels: dict, table: pd.DataFrame,
                  acceptance: pd.DataFrame, name: str, title: str) -> tuple[dict[str, str], dict[str, str]]:
    """Draw one setting's plots into `out`; returns {caption: file} of the leaderboard's and of the cost model's."""
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
    cost_plots = {}
    if group.predicted_speedup.notna().any():
        cost_plots["predicted vs measured speedup"] = f"predicted_vs_measured-{name}.png"
        plot_predicted_vs_measured(group, out / cost_plots["predicted vs measured speedup"], title)
    for i, profile in enumerate(profiles_of(group_runs)):
        cost_plots[f"forward time t(L)/t(1) ({i + 1})"] = f"forward_time-{name}-{i + 1}.png"
        plot_forward_time(profile, out / cost_plots[f"forward time t(L)/t(1) ({i + 1})"], title)
    return plots, cost_plots


def sweep_section(out: Path, sweep: pd.DataFrame) -> tuple[list[str], str]:
    """One batch-size sweep's Markdown lines and HTML (its plot written to `out`)."""
    first = sweep.iloc[0].to_dict()
    title = f"{first['model']} · {first['device']} · {first['dtype']} · max_new_tokens {first['max_new_tokens']}"
    name = f"batch_sweep-{slug(sweep.assign(batch_size=1), set())}.png"
    plot_batch_sweep(sweep, out / name, title)
    table = batch_sweep_table(sweep)
    md = [f"## Batch-size sweep: {title}", "", BATCH_NOTES, "", markdown(table), "", f"![batch sweep]({name})", ""]
    page = (f"<h2>Batch-size sweep: {html.escape(title)}</h2><p>{html.escape(BATCH_NOTES)}</p>"
            + _html_table(table) + f"<figure><img src='{html.escape(name)}' alt='batch sweep'></figure>")
    return md, page


def sweeps_across_section(out: Path, sweeps: list[pd.DataFrame]) -> tuple[list[str], str]:
    """One figure of the batch and concurrency sweeps of one model and max_new_tokens on different backends."""
    first = sweeps[0].iloc[0].to_dict()
    title = f"{first['model']} · max_new_tokens {first['max_new_tokens']}"
    name = f"batch_sweeps_across_backends-{slug(sweeps[0].assign(batch_size=1, device='all'), set())}.png"
    plot_batch_sweeps(sweeps, out / name, title)
    md = [f"## Batch and concurrency sweeps across backends: {title}", "", f"![sweeps across backends]({name})", ""]
    page = (f"<h2>Batch and concurrency sweeps across backends: {html.escape(title)}</h2>"
            f"<figure><img src='{html.escape(name)}' alt='sweeps across backends'></figure>")
    return md, page


LONG_INPUT_NOTES = (
    "The long-input task (conf/task/long_inputs.yaml): a column per input-length bucket (its prompts have at most "
    "that many tokens), `speedup (95% interval) · #MAT`; the numbers of the bucket's column in the leaderboard above, "
    "and its #MAT, which the leaderboard gives only overall."
)


TEMPERATURE_NOTES = (
    "Speedup and #MAT against gen.temperature: a column per temperature, `speedup (95% interval) · #MAT (95% "
    "interval)`, all tasks together; every run's questions at every seed (the latest run per seed), each interval a "
    "paired bootstrap over the (question, seed) pairs. Under sampling #MAT varies from seed to seed, so it gets an "
    "interval too. Settings otherwise equal (model, device, dtype, max_new_tokens, batch size) form one view."
)


DTYPE_NOTES = (
    "One model's weights in each dtype it ran in on this machine, a column per dtype: `speedup (95% interval) · "
    "#MAT`, all tasks together, each speedup over the vanilla decoded interleaved in that dtype's own run (vanilla's "
    "row: its tokens/s there). bfloat16 stands in for a GPU, where verifying many tokens costs about one forward; "
    "its answers may leave float32's vanilla at numeric ties (`≠` marks any other divergence). Best in the last "
    "column first."
)


def dtype_sections(out: Path, board: pd.DataFrame, runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The dtype view (regimes.dtype_groups) of every model run in several dtypes on one machine: Markdown lines,
    HTML sections, its plots and dtypes.csv written to `out`."""
    md, page, dtype_rows, taken = [], [], [], set()
    for group in dtype_groups(board, runs):
        table, first = dtype_table(group), group.iloc[0]
        shown = dtype_text(table)
        name = slug(group.assign(model=first["weights"].split(":")[-1].removesuffix(".gguf"), dtype="all"), taken)
        title = f"Regimes side by side: {' beside '.join(shown.columns[1:])} · {first['device_name']}"
        plot_dtypes(table, out / f"dtypes-{name}.png", title)
        section_md, section_html = regime_section(title, DTYPE_NOTES, shown, f"dtypes-{name}.png")
        md, page = md + section_md, page + [section_html]
        dtype_rows.append(table.assign(weights=first["weights"], device_name=first["device_name"]))
    if dtype_rows:
        pd.concat(dtype_rows, ignore_index=True).to_csv(out / "dtypes.csv", index=False)
    return md, page


def regime_sections(out: Path, board: pd.DataFrame, runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The dtype view of every model run in several dtypes, the long-input view of every setting that ran the
    long-input task and the temperature view of every temperature sweep (bench/report/regimes.py): their Markdown
    lines and HTML sections, their plots and CSV files (dtypes.csv, long_inputs.csv, temperature.csv) written to
    `out`."""
    md, page = dtype_sections(out, board, runs)
    bucket_rows, temperature_rows = [], []
    for _, group in board.groupby("setting", sort=False):
        if not bucket_tasks(group.task):
            continue
        table, name = bucket_table(group), slug(group, set())
        title = f"Long inputs: {name}"
        plot_buckets(table, out / f"long_inputs-{name}.png", title)
        section_md, section_html = regime_section(title, LONG_INPUT_NOTES, bucket_text(table),
                                                  f"long_inputs-{name}.png")
        md, page = md + section_md, page + [section_html]
        bucket_rows.append(table.assign(**group.iloc[0][SETTING_COLUMNS].to_dict()))
    for sweep in temperature_sweeps(runs):
        table, name = temperature_table(sweep), slug(sweep.assign(temperature=0.0), set())
        title = f"Speedup and #MAT against temperature: {name}"
        plot_temperature(table, out / f"temperature-{name}.png", title)
        section_md, section_html = regime_section(title, TEMPERATURE_NOTES, temperature_text(table),
                                                  f"temperature-{name}.png")
        md, page = md + section_md, page + [section_html]
        others = [c for c in SETTING_COLUMNS if c != "temperature"]
        temperature_rows.append(table.assign(**sweep.iloc[0][others].to_dict()))
    for rows, file in ((bucket_rows, "long_inputs.csv"), (temperature_rows, "temperature.csv")):
        if rows:
            pd.concat(rows, ignore_index=True).to_csv(out / file, index=False)
    return md, page


def regime_section(title: str, notes: str, shown: pd.DataFrame, figure: str) -> tuple[list[str], str]:
    """A view's Markdown lines and HTML: title, notes, table, figure."""
    md = [f"## {title}", "", notes, "", markdown(shown), "", f"![{title}]({figure})", ""]
    page = (f"<h2>{html.escape(title)}</h2><p>{html.escape(notes)}</p>" + _html_table(shown)
            + _html_figures({title: figure}))
    return md, page


def _html_figures(plots: dict[str, str]) -> str:
    return "".join(f"<figure><img src='{html.escape(f)}' alt='{html.escape(k)}'><figcaption>"
                   f"{html.escape(k)}</figcaption></figure>" for k, f in plots.items())


def html_page(sections: list[str]) -> str:
    """index.html: the notes, then every setting's and sweep's section."""
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}td:first-child,th:first-child"
             "{text-align:left}.facts{color:#444;font-size:90%}.warn{color:#a00}figure{display:inline-block;"
             "margin:0.5em;max-width:100%;vertical-align:top}img{max-width:100%;height:auto}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Speculative decoding leaderboard</title>"
            f"<style>{style}</style></head><body><h1>Speculative decoding leaderboard</h1><p>{html.escape(NOTES)}</p>"
            f"<p>{html.escape(COST_NOTES)}</p>"
            + "".join(sections) + "</body></html>\n")
