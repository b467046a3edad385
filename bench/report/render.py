"""`python -m bench.report <results_dir> --out <folder>`: a Spec-Bench style leaderboard, tables and plots of every run.

Reads every run folder under results_dir (answers.jsonl + meta.json, with baseline.jsonl when the method was not
vanilla) into one DataFrame of answer records, keeps per setting, method and task the most recent run, and
recomputes every number from the answers with bench/measure/metrics.py (never by averaging the runs' summary.csv rows).
Runs of different settings (model, device, dtype, max_new_tokens, temperature, batch size) go into separate tables;
settings that differ only in batch size also get a batch-size sweep: throughput speedup per method and batch size.
The page opens with a verdict per setting (bench/report/verdict.py), then a table of contents, the tables and plots
(a colour per method across all of them), and the definitions last; index.html holds its plots (bench/report/page.py).
Other tools' results (vLLM's bench serve, AIPerf, Spec-Bench; bench/report/imports/) join leaderboard.csv with their
`source` and a table of all sources side by side (bench/report/sources.py), never a setting's table or plots.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.measure.acceptance import CONTEXT_EDGES, POSITION_EDGES
from bench.report.exports import write_aiperf_exports
from bench.report.imports import with_imports
from bench.report.page import Section, html_figures, html_page, html_table, method_links, section_id
from bench.report.plots import (
    PLOT_PREFIXES,
    Palette,
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
from bench.report.sources import SOURCE_NOTES, imported_files, sources_table
from bench.report.tables import (
    accept_lengths_by_method,
    acceptance_by,
    acceptance_table,
    acceptance_text,
    backend_comparisons,
    backend_table,
    batch_sweep_table,
    batch_sweeps,
    board_of,
    cost_table,
    coverage_notes,
    formatted,
    leaderboard_markdown,
    markdown,
    profiles_of,
    rank_note,
    setting_facts,
    sweeps_across_backends,
    table_warnings,
    wide_table,
)
from bench.report.verdict import split_note, verdict


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


ACCEPTANCE_NOTES = (
    "k: the most draft tokens a step verified. #MAT (all steps): tokens per decode step over every step, pooled "
    "(Spec-Bench's; vLLM and SGLang pool too); #MAT (per request): each turn's tokens per step, averaged over turns "
    "(SpecForge's). accept length (drafted steps): 1 + accepted drafts per step that drafted (vLLM's and AIPerf's "
    "mean acceptance length); draft acceptance: accepted / drafted tokens; steps without draft: share of decode "
    "steps that drafted nothing (copy-based methods find no match). accept_rate_posK: share of decode steps that "
    "accepted at least K draft tokens; compare it only between methods of equal k. By context length / position: "
    "tokens per decode step of the steps that began at that cached context / that many tokens into the answer "
    "(steps counted in brackets). Per-request records: each run's acceptance.jsonl (docs/metrics.md)."
)


DEFINITIONS = {  # the leaderboard's columns and marks
    "Speedup": "mean tokens/s of the method over a task's questions / the same for vanilla on the same questions "
               "(vanilla decoded interleaved in the method's run); in brackets its 95% interval from a paired "
               "bootstrap over questions (none for a single question).",
    "Overall": "the speedup recomputed over all the questions of the tasks the row ran, not averaged over tasks; "
               "headed `Overall (N tasks)` where the table's tasks are not Spec-Bench's six. † the row has no run "
               "for some of the table's tasks: its Overall covers the others only.",
    "#Mean Accepted Tokens (#MAT)": "mean accept length over all decode steps = (generated tokens - turns) / decode "
                                    "steps, Spec-Bench's np.mean(accept_lengths): the tokens each decode step added "
                                    "(accepted drafts + the target's own), each turn's prefill token left out; "
                                    "vanilla 1.00. No interval: under greedy decoding the tokens and decode steps "
                                    "are the same every run.",
    "vanilla tok/s, tok/s": "mean tokens/s over the row's questions, of vanilla (decoded interleaved with the method) "
                            "and of the method.",
    "Lossless": "yes where every answer's greedy tokens equal vanilla's; `yes · N ties` where some differ only at a "
                "numeric tie (batched verification rounding a near-tie the other way, docs/metrics.md); else no, "
                "with the share of exact answers, the ties and the share of vanilla's tokens compared before the "
                "first divergences; — under sampling, where answers are not compared token by token.",
    "⚠": "the method was timed while starved of CPU (its process had less of the CPU than its threads could use): "
         "its speedups are not to be trusted; its bars and points carry ⚠ on the plots too.",
    "J/token": "GPU runs with NVML only: the device's energy while the method decoded / its generated tokens, all "
               "tasks together.",
    "Method": "each name links to its section of the project's docs (docs/methods.md, else the README's methods "
              "table); a method keeps one colour in every plot of the page.",
}


def write_report(results_dir: Path, out: Path, imported: pd.DataFrame | None = None) -> pd.DataFrame:
    """Everything `python -m bench.report` writes; returns the long leaderboard DataFrame, with a `source` column
    and the `imported` rows of other tools' results (bench.report.imports.load_imports), if any."""
    runs = load_runs(results_dir)
    if runs.empty and (imported is None or imported.empty):
        raise SystemExit(f"error: no runs (answers.jsonl + meta.json) under {results_dir}")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [p for prefix in PLOT_PREFIXES for p in out.glob(f"{prefix}-*.png")]:  # of an earlier report
        stale.unlink()
    latest = select_latest(runs)
    labels = method_labels(latest) if not latest.empty else {}
    board = board_of(latest, labels)
    everything = with_imports(board, imported)
    flat = everything.drop(columns="setting")
    flat.to_csv(out / "leaderboard.csv", index=False)
    flat.to_parquet(out / "leaderboard.parquet", index=False)

    context = Context(out, Palette(board.method), method_links(board.method.unique(), out))
    acc_md = ["# Acceptance", "", ACCEPTANCE_NOTES, ""]
    md, sections, verdicts, acceptance_rows, taken = [], [], [], [], set()
    slugs = {}
    for setting, group in board.groupby("setting", sort=False):
        section = setting_section(context, group, latest[latest.setting == setting], labels, taken,
                                  split_note(board, setting))
        md += section["md"]
        acc_md += section["acceptance_md"]
        sections.append(section["html"])
        verdicts.append((section["html"], section["verdict"]))
        acceptance_rows.append(section["acceptance"])
        slugs[setting] = section["slug"]
    imports = [sources_section(context, everything)] if len(everything) > len(board) else []
    for section_md, section in [*imports, *comparison_sections(context, board), *regime_sections(context, board, runs)]:
        md += section_md
        sections.append(section)

    verdict_md = [f"- {section.title}: {text}" for section, text in verdicts]
    (out / "leaderboard.md").write_text("\n".join(["# Speculative decoding leaderboard", "", *verdict_md, "", *md,
                                                   "## Definitions", "",
                                                   *(f"- **{term}**: {text}" for term, text in DEFINITIONS.items()),
                                                   "", COST_NOTES, ""]))
    (out / "acceptance.md").write_text("\n".join(acc_md))
    pd.concat(acceptance_rows or [acceptance_table(board)], ignore_index=True).to_csv(out / "acceptance.csv",
                                                                                   index=False)
    (out / "index.html").write_text(html_page(verdicts, sections, DEFINITIONS, COST_NOTES))
    if not runs.empty:
        write_aiperf_exports(latest, labels, slugs, out)
    return everything


@dataclass
class Context:
    """What every section of one report shares: its folder, a colour per method, links to the methods' docs."""

    out: Path
    palette: Palette
    links: dict[str, str]


def comparison_sections(context: Context, board: pd.DataFrame) -> list[tuple[list[str], Section]]:
    """The batch-size sweeps, the sweeps across backends and the backends side by side: Markdown lines and a
    section each."""
    sweeps = batch_sweeps(board)
    out = [sweep_section(context, sweep) for sweep in sweeps]
    out += [sweeps_across_section(context, together) for together in sweeps_across_backends(sweeps)]
    for comparison in backend_comparisons(board):
        table, first = backend_table(comparison, board), comparison.iloc[0]
        title = f"Across backends: {first['model']} · max_new_tokens {first['max_new_tokens']}"
        out.append(([f"## {title}", "", BACKEND_NOTES, "", markdown(table), ""],
                    Section(section_id(title), title, f"<p class='note'>{html.escape(BACKEND_NOTES)}</p>"
                            + html_table(table, context.links))))
    return out


def sources_section(context: Context, everything: pd.DataFrame) -> tuple[list[str], Section]:
    """Our runs' rows beside the imported ones (bench/report/sources.py): Markdown lines and a Section."""
    table, files = sources_table(everything), imported_files(everything)
    title = "All sources side by side"
    listed = "Imported: " + "; ".join(files) + "."
    md = [f"## {title}", "", SOURCE_NOTES, "", markdown(table), "", listed, ""]
    body = (f"<p class='note'>{html.escape(SOURCE_NOTES)}</p>" + html_table(table, context.links)
            + f"<p class='note'>{html.escape(listed)}</p>")
    return md, Section(section_id(title), title, body)


def setting_title(facts: dict[str, str], temperature: float) -> str:
    """A setting's heading: model, device, dtype, max_new_tokens, and temperature and batch size where not 0 and 1."""
    title = f"{facts['model']} · {facts['device']} · {facts['dtype']} · max_new_tokens {facts['max_new_tokens']}"
    if temperature != 0:
        title += f" · temperature {temperature:g}"
    return title + (f" · batch {facts['batch size']}" if facts["batch size"] != "1" else "")


def setting_section(context: Context, group: pd.DataFrame, group_runs: pd.DataFrame, labels: dict, taken: set[str],
                    note: str) -> dict:
    """One setting's part of the report (its plots written to the report's folder): Markdown lines of the leaderboard
    and of the acceptance page, its Section, its verdict, and its acceptance rows (with the setting's columns).
    `note`: why this model's runs are in several tables (split_note), or ''."""
    facts = setting_facts(group, group_runs)
    name = slug(group, taken)
    title = setting_title(facts, float(group.iloc[0]["temperature"]))
    table = wide_table(group)
    shown = formatted(table)
    notes, warning = coverage_notes(table), table_warnings(group)
    acceptance = acceptance_table(group)
    plots, cost_plots = setting_plots(context, group, group_runs, labels, table, acceptance, name, title)
    costs = cost_table(group)
    header = " · ".join(f"{k}: {v}" for k, v in facts.items())
    shown_acc, rank = acceptance_text(acceptance), rank_note(acceptance)
    by_context = acceptance_by(group_runs, labels, "context", CONTEXT_EDGES)
    by_position = acceptance_by(group_runs, labels, "position", POSITION_EDGES)
    page = (f"<p class='facts'>{html.escape(header)}</p>"
            + (f"<p class='note'>{html.escape(note)}</p>" if note else "") + html_table(shown, context.links)
            + "".join(f"<p class='note'>{html.escape(line)}</p>" for line in notes)
            + "".join(f"<p class='warn'>{html.escape(line.replace('**', ''))}</p>" for line in warning.split("\n\n")
                      if line)
            + html_figures(context.out, plots) + "<h3>Where the time goes</h3>" + html_table(costs, context.links)
            + html_figures(context.out, cost_plots)
            + "<h3>Acceptance</h3>" + html_table(shown_acc, context.links)
            + (f"<p class='warn'>{html.escape(rank)}</p>" if rank else "")
            + "<h3>Tokens per decode step by context length</h3>" + html_table(by_context, context.links)
            + "<h3>Tokens per decode step by position in the answer</h3>" + html_table(by_position, context.links))
    return {"md": [f"## {title}", "", header, "", *([note, ""] if note else []),
                   leaderboard_markdown(group), "",
                   "### Where the time goes", "", markdown(costs), ""],
            "acceptance_md": [f"## {title}", "", markdown(shown_acc), "", *([rank, ""] if rank else []),
                              "### Tokens per decode step by context length", "", markdown(by_context), "",
                              "### Tokens per decode step by position in the answer", "", markdown(by_position), ""],
            "html": Section(name, title, page), "slug": name,
            "verdict": verdict(group), "acceptance": acceptance.assign(**group.iloc[0][SETTING_COLUMNS].to_dict())}


def setting_plots(context: Context, group: pd.DataFrame, group_runs: pd.DataFrame, labels: dict, table: pd.DataFrame,
                  acceptance: pd.DataFrame, name: str, title: str) -> tuple[dict[str, str], dict[str, str]]:
    """Draw one setting's plots into the report's folder; returns {caption: file} of the leaderboard's and of the
    cost model's."""
    out, palette = context.out, context.palette
    plots = {
        "speedup by task": f"speedup_by_task-{name}.png",
        "speedup vs mean accepted tokens": f"speedup_vs_mat-{name}.png",
        "tokens per decode step": f"accept_hist-{name}.png",
        "acceptance by draft position": f"accept_by_position-{name}.png",
    }
    plot_speedup_by_task(group, out / plots["speedup by task"], title, palette)
    plot_speedup_vs_mat(table, out / plots["speedup vs mean accepted tokens"], title, palette)
    lengths = accept_lengths_by_method(group_runs, labels)
    lengths = {m: lengths[m] for m in table.Method if m in lengths}  # in the leaderboard's order
    plot_accept_histogram(lengths, out / plots["tokens per decode step"], title, palette)
    plot_accept_by_position(acceptance, out / plots["acceptance by draft position"], title, palette)
    cost_plots = {}
    if group.predicted_speedup.notna().any():
        cost_plots["predicted vs measured speedup"] = f"predicted_vs_measured-{name}.png"
        plot_predicted_vs_measured(group, out / cost_plots["predicted vs measured speedup"], title, palette)
    for i, profile in enumerate(profiles_of(group_runs)):
        cost_plots[f"forward time t(L)/t(1) ({i + 1})"] = f"forward_time-{name}-{i + 1}.png"
        plot_forward_time(profile, out / cost_plots[f"forward time t(L)/t(1) ({i + 1})"], title)
    return plots, cost_plots


def sweep_section(context: Context, sweep: pd.DataFrame) -> tuple[list[str], Section]:
    """One batch-size sweep's Markdown lines and Section (its plot written to the report's folder)."""
    first = sweep.iloc[0].to_dict()
    title = f"{first['model']} · {first['device']} · {first['dtype']} · max_new_tokens {first['max_new_tokens']}"
    name = f"batch_sweep-{slug(sweep.assign(batch_size=1), set())}.png"
    plot_batch_sweep(sweep, context.out / name, title, context.palette)
    return regime_section(context, f"Batch-size sweep: {title}", BATCH_NOTES, batch_sweep_table(sweep), name)


def sweeps_across_section(context: Context, sweeps: list[pd.DataFrame]) -> tuple[list[str], Section]:
    """One figure of the batch and concurrency sweeps of one model and max_new_tokens on different backends."""
    first = sweeps[0].iloc[0].to_dict()
    title = f"Batch and concurrency sweeps across backends: {first['model']} · max_new_tokens " \
            f"{first['max_new_tokens']}"
    name = f"batch_sweeps_across_backends-{slug(sweeps[0].assign(batch_size=1, device='all'), set())}.png"
    plot_batch_sweeps(sweeps, context.out / name, title, context.palette)
    md = [f"## {title}", "", f"![{title}]({name})", ""]
    return md, Section(section_id(title), title, html_figures(context.out, {title: name}))


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


def dtype_sections(context: Context, board: pd.DataFrame, runs: pd.DataFrame) -> list[tuple[list[str], Section]]:
    """The dtype view (regimes.dtype_groups) of every model run in several dtypes on one machine: Markdown lines and
    a Section each; its plots and dtypes.csv written to the report's folder."""
    sections, dtype_rows, taken = [], [], set()
    for group in dtype_groups(board, runs):
        table, first = dtype_table(group), group.iloc[0]
        shown = dtype_text(table)
        name = slug(group.assign(model=first["weights"].split(":")[-1].removesuffix(".gguf"), dtype="all"), taken)
        title = f"Regimes side by side: {' beside '.join(shown.columns[1:])} · {first['device_name']}"
        plot_dtypes(table, context.out / f"dtypes-{name}.png", title)
        sections.append(regime_section(context, title, DTYPE_NOTES, shown, f"dtypes-{name}.png"))
        dtype_rows.append(table.assign(weights=first["weights"], device_name=first["device_name"]))
    if dtype_rows:
        pd.concat(dtype_rows, ignore_index=True).to_csv(context.out / "dtypes.csv", index=False)
    return sections


def regime_sections(context: Context, board: pd.DataFrame, runs: pd.DataFrame) -> list[tuple[list[str], Section]]:
    """The dtype view of every model run in several dtypes, the long-input view of every setting that ran the
    long-input task and the temperature view of every temperature sweep (bench/report/regimes.py): Markdown lines
    and a Section each; their plots and CSV files (dtypes.csv, long_inputs.csv, temperature.csv) written to the
    report's folder."""
    out, palette = context.out, context.palette
    sections = dtype_sections(context, board, runs)
    bucket_rows, temperature_rows = [], []
    for _, group in board.groupby("setting", sort=False):
        if not bucket_tasks(group.task):
            continue
        table, name = bucket_table(group), slug(group, set())
        title = f"Long inputs: {name}"
        plot_buckets(table, out / f"long_inputs-{name}.png", title, palette)
        sections.append(regime_section(context, title, LONG_INPUT_NOTES, bucket_text(table),
                                       f"long_inputs-{name}.png"))
        bucket_rows.append(table.assign(**group.iloc[0][SETTING_COLUMNS].to_dict()))
    for sweep in temperature_sweeps(runs):
        table, name = temperature_table(sweep), slug(sweep.assign(temperature=0.0), set())
        title = f"Speedup and #MAT against temperature: {name}"
        plot_temperature(table, out / f"temperature-{name}.png", title, palette)
        sections.append(regime_section(context, title, TEMPERATURE_NOTES, temperature_text(table),
                                       f"temperature-{name}.png"))
        others = [c for c in SETTING_COLUMNS if c != "temperature"]
        temperature_rows.append(table.assign(**sweep.iloc[0][others].to_dict()))
    for rows, file in ((bucket_rows, "long_inputs.csv"), (temperature_rows, "temperature.csv")):
        if rows:
            pd.concat(rows, ignore_index=True).to_csv(out / file, index=False)
    return sections


def regime_section(context: Context, title: str, notes: str, shown: pd.DataFrame,
                   figure: str) -> tuple[list[str], Section]:
    """A view's Markdown lines and Section: title, notes, table, figure."""
    md = [f"## {title}", "", notes, "", markdown(shown), "", f"![{title}]({figure})", ""]
    body = (f"<p class='note'>{html.escape(notes)}</p>" + html_table(shown, context.links)
            + html_figures(context.out, {title: figure}))
    return md, Section(section_id(title), title, body)
