"""bench.report.regress against a committed baseline: passes unchanged, fails naming method and task on each kind of
drop."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from bench.artifacts import PROJECT_ROOT
from bench.regress import main
from bench.report.regress import RegressError, regress
from bench.report.render import write_report
from bench.report.runs import load_runs
from bench.report.tables import leaderboard
from tests.report_fixtures import BASE_TIME, QUESTIONS, method_run, vanilla_records, write_run


def pld_run(path: Path, accepts: list[int] = (3, 3, 3, 2), factor: float = 1.5, diverge: dict | None = None,
            limit_to: set[int] | None = None, **kw) -> Path:
    """A pld run on every task (or the questions in `limit_to`), `factor` times vanilla's speed; `diverge` gives
    qid -> divergence record."""
    qids = [qid for qid, _ in QUESTIONS if limit_to is None or qid in limit_to]
    return method_run(path, "pld", {qid: factor for qid in qids}, accepts, diverge=diverge, **kw)


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    write_run(root / "vanilla", "vanilla", vanilla_records(BASE_TIME))
    pld_run(root / "pld")
    return root


@pytest.fixture
def baseline(results, tmp_path):
    path = tmp_path / "baselines" / "m-cpu.json"
    assert regress(results, path, update=True, out=io.StringIO()) == 0
    return path


def check(path: Path, baseline: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    status = regress(path, baseline, out=out, **kw)
    return status, out.getvalue()


def edit(baseline: Path, method: str, task: str, **values) -> None:
    data = json.loads(baseline.read_text())
    data["methods"][method][task].update(values)
    baseline.write_text(json.dumps(data))


def test_update_writes_every_method_and_task_and_an_unchanged_baseline_passes(results, baseline):
    data = json.loads(baseline.read_text())
    assert data["setting"] == {"model": "m", "device": "cpu", "dtype": "bfloat16", "max_new_tokens": 32,
                               "temperature": 0.0, "batch_size": 1}
    assert sorted(data["methods"]) == ["pld", "vanilla"] and len(data["methods"]["pld"]) == 7
    assert data["methods"]["pld"]["qa"] == {"n_questions": 1, "mean_accepted_tokens": 2.75, "exact_match": 1.0,
                                            "speedup": 1.5}
    assert data["provenance"]["source"] == str(results) and data["provenance"]["command"].startswith("python ")
    status, text = check(results, baseline)
    assert status == 0 and "passed: 0 problem(s)" in text and "FAIL" not in text


def test_baseline_demanding_more_accepted_tokens_fails_naming_method_and_task(results, baseline):
    edit(baseline, "pld", "qa", mean_accepted_tokens=2.865)  # now 2.75: 4% lower, tolerance 2%
    status, text = check(results, baseline)
    assert status == 1
    assert "FAIL  pld / qa: mean accepted tokens 2.750 < baseline 2.865 by 4.0% (tolerance 2%" in text
    assert text.count("FAIL  ") == 1 and "FAILED: 1 problem(s)" in text
    status, _ = check(results, baseline, mat_tolerance=0.05)  # within a wider tolerance
    assert status == 0


def test_mean_accepted_tokens_within_tolerance_passes(results, baseline):
    edit(baseline, "pld", "overall", mean_accepted_tokens=2.75 * 1.019)
    assert check(results, baseline)[0] == 0


def test_exact_match_drop_fails_naming_method_task_and_question(tmp_path, baseline):
    wrong = {"turn": 0, "position": 4, "logit_gap": 2.5, "numeric_tie": False}
    pld_run(tmp_path / "now" / "pld", diverge={481: wrong})
    write_run(tmp_path / "now" / "vanilla", "vanilla", vanilla_records(BASE_TIME))
    status, text = check(tmp_path / "now", baseline)
    assert status == 1
    assert "FAIL  pld / rag: output differs from vanilla beyond a numeric tie on question(s) 481 " \
           "(exact_match 0.000, 0 numeric tie(s) accepted)" in text


def test_numeric_tie_is_accepted_and_noted(tmp_path, baseline):
    tie = {"turn": 0, "position": 4, "logit_gap": 0.01, "numeric_tie": True}
    pld_run(tmp_path / "now" / "pld", diverge={321: tie})
    write_run(tmp_path / "now" / "vanilla", "vanilla", vanilla_records(BASE_TIME))
    status, text = check(tmp_path / "now", baseline)
    assert status == 0 and "note  pld / qa: 1 question(s) differ from vanilla at a numeric tie only" in text


def test_speedup_drop_beyond_its_tolerance_fails(tmp_path, baseline):
    pld_run(tmp_path / "slow" / "pld", factor=1.2)  # 20% slower than the baseline's 1.5x: within 30%
    assert check(tmp_path / "slow", baseline, allow_missing=True)[0] == 0
    pld_run(tmp_path / "slower" / "pld", factor=0.9)  # 40% slower
    status, text = check(tmp_path / "slower", baseline, allow_missing=True)
    assert status == 1 and "FAIL  pld / qa: speedup 0.900 < baseline 1.500 by 40.0% (tolerance 30%" in text
    assert check(tmp_path / "slower", baseline, allow_missing=True, speedup_tolerance=0.5)[0] == 0


def test_missing_entries_fail_in_one_line_unless_allowed(tmp_path, baseline):
    pld_run(tmp_path / "only-pld" / "pld")
    status, text = check(tmp_path / "only-pld", baseline)
    assert status == 1 and text.count("FAIL  ") == 1
    assert "FAIL  7 baseline method x task entries are not in these runs: 1 method(s) not run (vanilla)\n" in text
    status, text = check(tmp_path / "only-pld", baseline, allow_missing={"vanilla"})  # bench.smoke skipped vanilla
    assert status == 0 and "note  7 baseline method x task entries are not in these runs (allowed): 1 method(s) not " \
                           "run (vanilla)\n" in text
    assert check(tmp_path / "only-pld", baseline, allow_missing={"sps"})[0] == 1


def test_runs_of_part_of_the_baseline_say_what_they_hold_and_how_to_gate_only_that(tmp_path, baseline, capsys):
    """A newcomer's runs (pld on two tasks, no vanilla): what they hold, what they lack as a count (pld's overall
    averages other tasks here, so it is not compared), and the flag that gates only what they hold."""
    pld_run(tmp_path / "some" / "pld", limit_to={321, 481})
    status, text = check(tmp_path / "some", baseline)
    assert status == 1 and text.splitlines()[1:] == [
        "regress: these runs hold 2 of the baseline's 14 method x task entries: pld on qa, rag",
        "FAIL  12 baseline method x task entries are not in these runs: 1 method(s) not run (vanilla); pld without "
        "mt_bench, translation, summarization, math_reasoning, overall (an overall over other tasks than the "
        "baseline's is not compared)",
        f"regress: to gate only the entries these runs hold: python -m bench.regress {tmp_path / 'some'} --baseline "
        f"{baseline} --allow-missing",
        "regress: FAILED: 1 problem(s); 2 of 14 baseline method x task entries compared, 1 methods in the runs"]
    with pytest.raises(SystemExit) as allowed:
        main([str(tmp_path / "some"), "--baseline", str(baseline), "--allow-missing"])
    text = capsys.readouterr().out
    assert allowed.value.code == 0 and "note  12 baseline method x task entries are not in these runs (allowed)" in text
    assert "regress: passed: 0 problem(s); 2 of 14 baseline method x task entries compared" in text


def test_runs_that_hold_none_of_the_baseline_are_nothing_to_compare(tmp_path, baseline):
    method_run(tmp_path / "other" / "sps", "sps", {qid: 1.5 for qid, _ in QUESTIONS}, [3, 3, 3, 2])
    with pytest.raises(RegressError, match=r"none of the baseline's 14 method x task entries is in these runs \(they "
                                           r"hold sps\)"):
        check(tmp_path / "other", baseline, allow_missing=True)


def test_other_question_counts_are_not_compared(results, baseline):
    edit(baseline, "pld", "qa", n_questions=2)
    status, text = check(results, baseline)
    assert status == 1 and "FAIL  pld / qa: ran on 1 questions, the baseline on 2: not comparable" in text


def test_report_folder_and_run_folder_are_read_too(results, baseline, tmp_path):
    write_report(results, tmp_path / "report")
    assert check(tmp_path / "report", baseline)[0] == 0
    edit(baseline, "pld", "mt_bench", mean_accepted_tokens=3.0)
    status, text = check(tmp_path / "report", baseline)
    assert status == 1 and "pld / mt_bench: mean accepted tokens" in text
    status, text = check(results / "pld", baseline)  # one run folder: vanilla missing, mt_bench still too low
    assert status == 1 and "pld / mt_bench" in text and "not in these runs: 1 method(s) not run (vanilla)" in text


def test_runs_of_another_setting_are_an_error(tmp_path, baseline):
    pld_run(tmp_path / "fp32" / "pld", dtype="float32")
    with pytest.raises(RegressError, match="no runs with the baseline's setting"):
        regress(tmp_path / "fp32", baseline, out=io.StringIO())
    with pytest.raises(RegressError, match="no baseline file"):
        regress(tmp_path / "fp32", tmp_path / "none.json", out=io.StringIO())


def test_update_refuses_runs_that_differ_from_vanilla_and_merges_otherwise(tmp_path, baseline):
    wrong = {"turn": 0, "position": 4, "logit_gap": 2.5, "numeric_tie": False}
    pld_run(tmp_path / "bad" / "pld", diverge={81: wrong})
    before = baseline.read_text()
    status, text = check(tmp_path / "bad", baseline, update=True)
    assert status == 1 and "baseline NOT written" in text and baseline.read_text() == before
    pld_run(tmp_path / "better" / "pld", accepts=(4, 4, 3), factor=2.0)
    assert check(tmp_path / "better", baseline, update=True)[0] == 0
    data = json.loads(baseline.read_text())
    assert data["methods"]["pld"]["qa"]["mean_accepted_tokens"] == 3.6667 and "vanilla" in data["methods"]


def test_cli_exit_codes(results, baseline, capsys):
    with pytest.raises(SystemExit) as passed:
        main([str(results), "--baseline", str(baseline)])
    edit(baseline, "pld", "qa", speedup=3.0)
    with pytest.raises(SystemExit) as failed:
        main([str(results), "--baseline", str(baseline)])
    with pytest.raises(SystemExit) as unusable:
        main([str(results), "--baseline", str(baseline.with_name("missing.json"))])
    assert (passed.value.code, failed.value.code, unusable.value.code) == (0, 1, 2)
    captured = capsys.readouterr()
    assert "FAIL  pld / qa: speedup 1.500 < baseline 3.000 by 50.0%" in captured.out
    assert "no baseline file" in captured.err


def overall_speedup_only(baseline: Path) -> None:
    """Stop checking per-task speedups (one question each, so they have no interval): overall alone is gated."""
    data = json.loads(baseline.read_text())
    for task, entry in data["methods"]["pld"].items():
        entry["speedup"] = entry["speedup"] if task == "overall" else None
    baseline.write_text(json.dumps(data))


def test_speedup_fails_only_when_its_whole_interval_lies_below_the_floor(tmp_path, baseline):
    overall_speedup_only(baseline)  # baseline overall 1.5x; floor 1.05 at 30%
    noisy = method_run(tmp_path / "noisy" / "pld", "pld", {81: 0.4, 161: 3.0, 241: 0.5, 321: 0.6, 401: 2.0,
                                                           481: 0.4}, [3, 3, 3, 2])
    row = leaderboard(load_runs(noisy)).set_index("task").loc["overall"]
    assert row.speedup < 1.05 <= row.speedup_ci_high  # below the floor, but its interval reaches it
    status, text = check(noisy.parent, baseline, allow_missing=True)
    assert status == 0 and f"note  pld / overall: speedup {row.speedup:.3f} < baseline 1.500" in text
    assert "reaches the floor" in text and "a noisy run, not failed" in text
    slow = method_run(tmp_path / "slow" / "pld", "pld", {81: 0.7, 161: 0.8, 241: 0.6, 321: 0.75, 401: 0.9,
                                                         481: 0.65}, [3, 3, 3, 2])
    row = leaderboard(load_runs(slow)).set_index("task").loc["overall"]
    status, text = check(slow.parent, baseline, allow_missing=True)
    assert status == 1 and f"FAIL  pld / overall: speedup {row.speedup:.3f} < baseline 1.500" in text
    assert f"and all of its 95% interval {row.speedup_ci_low:.3f}-{row.speedup_ci_high:.3f} lies below" in text


def test_a_leaderboard_without_intervals_is_gated_on_the_figure(results, baseline, tmp_path):
    write_report(results, tmp_path / "report")
    csv = tmp_path / "report" / "leaderboard.csv"
    pd.read_csv(csv).drop(columns=["speedup_ci_low", "speedup_ci_high", "cpu_share", "starved"]).to_csv(csv)
    assert check(tmp_path / "report", baseline)[0] == 0
    edit(baseline, "pld", "overall", speedup=3.0)
    status, text = check(tmp_path / "report", baseline)
    assert status == 1 and "FAIL  pld / overall: speedup 1.500 < baseline 3.000 by 50.0% (tolerance 30%" in text


def test_a_starved_run_is_named_in_a_note(tmp_path, baseline):
    pld_run(tmp_path / "now" / "pld", cpu_share=0.2)
    status, text = check(tmp_path / "now", baseline, allow_missing=True)
    assert status == 0 and "note  pld / overall: timed while starved of CPU (CPU share 20%)" in text


def test_a_baseline_written_before_batching_is_batch_ones(results, baseline, tmp_path):
    """A baseline whose setting has no batch_size (files before batching) is batch 1's: batch-1 runs pass against
    it, batch-4 runs are of another setting."""
    data = json.loads(baseline.read_text())
    del data["setting"]["batch_size"]
    baseline.write_text(json.dumps(data))
    assert check(results, baseline)[0] == 0
    write_run(tmp_path / "b4" / "vanilla", "vanilla", vanilla_records(BASE_TIME), batch_size=4)
    pld_run(tmp_path / "b4" / "pld", batch_size=4)
    with pytest.raises(RegressError, match="no runs with the baseline's setting"):
        regress(tmp_path / "b4", baseline, out=io.StringIO())


def board_like(baseline: dict) -> pd.DataFrame:
    """A leaderboard.csv's rows that measured exactly a baseline's figures, in its setting (batch 1 where absent)."""
    setting = {"batch_size": 1, **baseline["setting"], "device_name": baseline["provenance"]["device_name"]}
    return pd.DataFrame([{**setting, "method": method, "task": task, **entry, "exact_match_or_tie": 1.0,
                          "numeric_ties": 0, "diverged_questions": "", "speedup_ci_low": entry["speedup"],
                          "speedup_ci_high": entry["speedup"], "cpu_share": 1.0, "starved": False}
                         for method, tasks in baseline["methods"].items() for task, entry in tasks.items()])


@pytest.mark.parametrize("batch_column", [True, False])
def test_the_committed_baseline_is_accepted_by_the_gate(tmp_path, batch_column):
    """results/baselines/smollm2_135m-cpu.json: a leaderboard with its own figures passes against it, with or
    without a batch_size column (leaderboards written before batching); the file's methods keep their labels."""
    path = PROJECT_ROOT / "results" / "baselines" / "smollm2_135m-cpu.json"
    data = json.loads(path.read_text())
    assert data["setting"]["batch_size"] == 1 and not any("+adaptive" in m for m in data["methods"])
    board = board_like(data)
    (tmp_path / "report").mkdir()
    board.drop(columns=[] if batch_column else ["batch_size"]).to_csv(tmp_path / "report" / "leaderboard.csv")
    status, text = check(tmp_path / "report", path)
    entries = sum(len(tasks) for tasks in data["methods"].values())
    assert status == 0 and f"passed: 0 problem(s); {entries} of {entries} baseline method x task entries compared" \
        in text and "these runs hold" not in text
    assert "batch_size=1" in text


def test_a_baseline_of_format_1_is_refused_and_update_rewrites_it(results, baseline):
    data = json.loads(baseline.read_text())
    del data["format"]
    data["methods"]["sps"] = {"overall": {"n_questions": 6, "mean_accepted_tokens": 1.3, "exact_match": 1.0}}
    baseline.write_text(json.dumps(data))
    with pytest.raises(RegressError, match=r"counts #MAT with each turn's prefill as a step \(format 1\); rewrite"):
        check(results, baseline)
    assert check(results, baseline, update=True)[0] == 0
    data = json.loads(baseline.read_text())
    assert data["format"] == 2 and sorted(data["methods"]) == ["pld", "vanilla"]  # format-1 entries dropped
    assert check(results, baseline)[0] == 0
