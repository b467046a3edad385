"""`python -m bench.regress PATH --baseline FILE`: fail when runs regressed against a committed baseline.

PATH is a run folder, a results folder (searched recursively, as `bench.report` does) or a report folder (its
leaderboard.csv is read). FILE is a JSON baseline, e.g. results/baselines/smollm2_135m-cpu.json, holding per
method x task: n_questions, mean_accepted_tokens, exact_match, speedup. Exit status 1 (with one line per problem
naming the method and task) when:
- any method's greedy output differs from its baseline's on a question, except where the first differing token was a
  numeric tie (the target's top-2 logits within model.tie_margin; bench.measure.exactness records it): batched
  verification and one-token decoding may round such a tie either way, so a tie is accepted and only counted;
- mean accepted tokens falls below the baseline by more than --mat-tolerance (relative, default 2%);
- speedup falls below the baseline by more than --speedup-tolerance (relative, default 30%: timings are noisy),
  and so does the top of its 95% interval (bench.measure.metrics): a noisy run whose interval still reaches the floor
  is a note, a real loss fails. Runs without an interval (one question, or older files) use the point figure;
- a method x task of the baseline ran on another number of questions;
- a method x task of the baseline is missing from PATH: counted in one line after one that says what PATH holds
  (a method's overall over other tasks than the baseline's counts as missing); --allow-missing makes that a note,
  gating only what PATH holds. PATH holding none of the baseline is nothing to compare (exit status 2).
A run timed while starved of CPU (bench.measure.contention) is named in a note.
`--update` writes the baseline from PATH instead (merging into an existing file), after the exact-match check.
A baseline carries the records' `format` (bench/records.py); one without it counted #MAT with the prefill as a step
and is refused (`--update` rewrites it from current runs, dropping its old entries).
"""
from __future__ import annotations

import json
import math
import shlex
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.records import RECORD_FORMAT
from bench.report.imports import OURS
from bench.report.runs import load_runs, setting_of
from bench.report.tables import is_flagged, leaderboard

DEFAULT_TOLERANCES = {"mean_accepted_tokens": 0.02, "speedup": 0.30}
NEWER_COLUMNS = ["speedup_ci_low", "speedup_ci_high", "cpu_share", "starved"]  # absent from older leaderboards


class RegressError(Exception):
    """PATH or FILE cannot be compared at all (no runs, no baseline, ambiguous setting); exit status 2."""


@dataclass
class Finding:
    failed: bool
    method: str
    task: str
    message: str

    def __str__(self) -> str:
        where = f"{self.method} / {self.task}: " if self.method else ""  # none: a finding about many entries
        return f"{'FAIL' if self.failed else 'note'}  {where}{self.message}"


def current_board(path: Path) -> pd.DataFrame:
    """The long leaderboard (one row per setting x method x task) of a report folder or of the runs under path."""
    path = Path(path)
    if (path / "leaderboard.csv").exists():
        board = pd.read_csv(path / "leaderboard.csv", keep_default_na=True, dtype={"diverged_questions": str})
    else:
        runs = load_runs(path)
        if runs.empty:
            raise RegressError(f"no runs (answers.jsonl + meta.json) and no leaderboard.csv under {path}")
        board = leaderboard(runs)
    if "source" in board:  # other tools' imported rows (bench/report/imports/) are not ours to gate
        board = board[board.source.fillna(OURS) == OURS]
    if board.empty:
        raise RegressError(f"the leaderboard under {path} has no rows")
    board = board.reindex(columns=[*board.columns, *(c for c in NEWER_COLUMNS if c not in board.columns)])
    board["device"] = board.device.astype(str).str.split(":").str[0]
    board["diverged_questions"] = board.diverged_questions.fillna("").astype(str)
    return board


def rows_for_setting(board: pd.DataFrame, setting: dict | None) -> pd.DataFrame:
    """The rows measured under `setting` (bench/report/runs.py's SETTING, the device as its type; a baseline
    written before batching is batch 1's); one device only."""
    keys = board.apply(lambda row: json.dumps(setting_of(row), sort_keys=True), axis=1)
    settings = set(keys)
    if setting is None:
        if len(settings) != 1:
            raise RegressError("the runs hold several settings, so which one the baseline is for is ambiguous: "
                               + "; ".join(sorted(settings)) + ". Point PATH at runs of one setting.")
        setting = json.loads(next(iter(settings)))
    rows = board[keys == json.dumps(setting_of(setting), sort_keys=True)]
    if rows.empty:
        raise RegressError(f"no runs with the baseline's setting {json.dumps(setting, sort_keys=True)}; the runs have: "
                           + "; ".join(sorted(settings)))
    if rows.device_name.nunique() > 1:
        raise RegressError(f"runs of the baseline's setting come from several devices "
                           f"({sorted(rows.device_name.unique())}); point PATH at the runs of one machine")
    return rows


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def exact_match_findings(rows: pd.DataFrame) -> list[Finding]:
    """Every method x task whose greedy outputs differ from the baseline's beyond numeric ties; ties are noted."""
    findings = []
    for row in rows[rows.task != "overall"].itertuples():
        if _nan(row.exact_match_or_tie):  # sampling: no exact match to check
            continue
        if row.exact_match_or_tie < 1.0:
            findings.append(Finding(True, row.method, row.task,
                                    f"output differs from vanilla beyond a numeric tie on question(s) "
                                    f"{row.diverged_questions.replace(';', ', ')} (exact_match {row.exact_match:.3f}, "
                                    f"{int(row.numeric_ties)} numeric tie(s) accepted)"))
        elif row.numeric_ties:
            findings.append(Finding(False, row.method, row.task,
                                    f"{int(row.numeric_ties)} question(s) differ from vanilla at a numeric tie only "
                                    f"(accepted; exact_match {row.exact_match:.3f})"))
    return findings


@dataclass
class Coverage:
    """A baseline's method x task entries that the runs hold (`compared`) and those they lack (`missing`), each as
    {method: [task, ...]} in the baseline's order."""
    compared: dict[str, list[str]]
    missing: dict[str, list[str]]


def entry_count(entries: dict[str, list[str]]) -> int:
    return sum(len(tasks) for tasks in entries.values())


def coverage(rows: pd.DataFrame, baseline: dict) -> Coverage:
    """Which baseline entries the rows hold. A method's `overall` counts as held only where the rows hold the same
    tasks of it as the baseline: over other tasks it averages other questions."""
    held: dict[str, set[str]] = {}
    for method, task in zip(rows.method, rows.task):
        held.setdefault(method, set()).add(task)
    compared: dict[str, list[str]] = {}
    missing: dict[str, list[str]] = {}
    for method, tasks in baseline.get("methods", {}).items():
        ran = held.get(method, set())
        same_tasks = ran - {"overall"} == set(tasks) - {"overall"}
        for task in tasks:
            found = task in ran and (task != "overall" or same_tasks)
            (compared if found else missing).setdefault(method, []).append(task)
    return Coverage(compared, missing)


def compare(rows: pd.DataFrame, baseline: dict, tolerances: dict,
            allow_missing: bool | Collection[str] = False) -> list[Finding]:
    """Findings of the current rows (one setting) against the baseline's methods; failed ones make regress fail.
    allow_missing: True, or the methods that may be absent (a smoke run that skipped them), without failing."""
    findings = exact_match_findings(rows)
    current = {(r.method, r.task): r for r in rows.itertuples()}
    covered = coverage(rows, baseline)
    for method, tasks in covered.compared.items():
        for task in tasks:
            findings += entry_findings(method, task, baseline["methods"][method][task], current[method, task],
                                       tolerances)
    findings += missing_findings(covered.missing, baseline, allow_missing)
    for row in rows[(rows.task == "overall") & rows.starved.map(is_flagged)].itertuples():
        findings.append(Finding(False, row.method, "overall", f"timed while starved of CPU (CPU share "
                                f"{row.cpu_share:.0%}): its speedups are not to be trusted"))
    for method in sorted(set(rows.method) - set(baseline.get("methods", {}))):
        findings.append(Finding(False, method, "*", "not in the baseline (add it with --update)"))
    return findings


def entry_findings(method: str, task: str, expected: dict, row, tolerances: dict) -> list[Finding]:
    """One baseline entry against the row of the runs that holds it: its question count, #MAT and speedup."""
    if expected.get("n_questions") is not None and int(row.n_questions) != int(expected["n_questions"]):
        return [Finding(True, method, task, f"ran on {int(row.n_questions)} questions, the baseline on "
                                            f"{int(expected['n_questions'])}: not comparable (same task.limit, or "
                                            f"--update)")]
    mat = row.mean_accepted_tokens
    interval = (row.speedup_ci_low, row.speedup_ci_high)
    if any(_nan(v) for v in interval):  # one question, or a leaderboard written before intervals
        interval = (row.speedup, row.speedup)
    return drop_findings(method, task, "mean accepted tokens", expected.get("mean_accepted_tokens"), (mat, mat, mat),
                         tolerances["mean_accepted_tokens"]) + \
        drop_findings(method, task, "speedup", expected.get("speedup"), (row.speedup, *interval),
                      tolerances["speedup"])


def missing_findings(missing: dict[str, list[str]], baseline: dict,
                     allow_missing: bool | Collection[str]) -> list[Finding]:
    """The baseline entries the runs lack, as one failed finding (those not allowed) and one note (those allowed)
    rather than a line each."""
    findings = []
    for failed in (True, False):
        part = {method: tasks for method, tasks in missing.items() if failed != may_miss(method, allow_missing)}
        if part:
            allowed = "" if failed else " (allowed)"
            findings.append(Finding(failed, "", "", f"{entry_count(part)} baseline method x task entries are not "
                                                    f"in these runs{allowed}: {missing_text(part, baseline)}"))
    return findings


def may_miss(method: str, allow_missing: bool | Collection[str]) -> bool:
    """Whether `allow_missing` (True, or the methods that may be absent) lets the runs lack `method`'s entries."""
    return allow_missing if isinstance(allow_missing, bool) else method in allow_missing


def missing_text(missing: dict[str, list[str]], baseline: dict) -> str:
    """`2 method(s) not run (eagle, sps); pld, vanilla without mt_bench, overall (...)`: the methods with no entry in
    the runs, then the others grouped by the tasks they lack."""
    unrun = [method for method, tasks in missing.items() if len(tasks) == len(baseline["methods"][method])]
    parts = [f"{len(unrun)} method(s) not run ({', '.join(sorted(unrun))})"] if unrun else []
    partly = {method: tasks for method, tasks in missing.items() if method not in unrun}
    parts += [f"{methods} without {tasks}" for tasks, methods in grouped(partly).items()]
    overall = any("overall" in tasks for tasks in partly.values())
    return "; ".join(parts) + (" (an overall over other tasks than the baseline's is not compared)" if overall else "")


def grouped(entries: dict[str, list[str]]) -> dict[str, str]:
    """{"task, task": "method, method"}: the methods of `entries` grouped by their tasks."""
    groups: dict[str, list[str]] = {}
    for method, tasks in entries.items():
        groups.setdefault(", ".join(tasks), []).append(method)
    return {tasks: ", ".join(methods) for tasks, methods in groups.items()}


def drop_findings(method: str, task: str, name: str, want: float | None, got: tuple[float, float, float],
                  tolerance: float) -> list[Finding]:
    """`got` = (figure, interval low, interval high) against the baseline's `want`: a failure when even the
    interval's top lies below want x (1 - tolerance); a note when the figure alone does (a noisy run) or when the
    whole interval lies above want x (1 + tolerance). A figure without an interval passes (got, got, got)."""
    value, low, high = got
    if _nan(want) or _nan(value):
        return []
    floor = want * (1 - tolerance)
    drop = f"{name} {value:.3f} < baseline {want:.3f} by {1 - value / want:.1%}"
    limits = f"(tolerance {tolerance:.0%}, floor {floor:.3f})"
    has_interval = (low, high) != (value, value)
    if high < floor - 1e-9:
        also = f", and all of its 95% interval {low:.3f}-{high:.3f} lies below the floor" if has_interval else ""
        return [Finding(True, method, task, f"{drop}{also} {limits}")]
    if value < floor - 1e-9:
        return [Finding(False, method, task, f"{drop}, but its 95% interval {low:.3f}-{high:.3f} reaches the floor "
                                             f"{limits}: a noisy run, not failed")]
    if low > want * (1 + tolerance) + 1e-9:
        return [Finding(False, method, task, f"{name} {value:.3f} > baseline {want:.3f} by {value / want - 1:.1%}: "
                                             f"refresh it with --update?")]
    return []


def baseline_entries(rows: pd.DataFrame) -> dict:
    entries: dict[str, dict] = {}
    for row in rows.itertuples():
        entries.setdefault(row.method, {})[row.task] = {
            "n_questions": int(row.n_questions),
            "mean_accepted_tokens": round(float(row.mean_accepted_tokens), 4),
            "exact_match": None if _nan(row.exact_match) else round(float(row.exact_match), 4),
            "speedup": None if _nan(row.speedup) else round(float(row.speedup), 4),
        }
    return entries


def _relative(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (baselines are committed; no home paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def update_baseline(path: Path, rows: pd.DataFrame, existing: dict | None, tolerances: dict, source: Path) -> dict:
    first = rows.iloc[0]
    baseline = {
        "format": RECORD_FORMAT,
        "setting": setting_of(first),
        "tolerances": tolerances,
        "provenance": {"device_name": str(first["device_name"]), "torch": str(first["torch"]),
                       "transformers": str(first["transformers"]), "updated": time.strftime("%Y-%m-%d"),
                       "source": _relative(source), "command": shlex.join(["python", *sys.orig_argv[1:]])},
        "methods": {**(existing or {}).get("methods", {}), **baseline_entries(rows)},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(baseline, indent=2, sort_keys=False) + "\n")
    return baseline


def regress(path: Path, baseline_path: Path, mat_tolerance: float | None = None,
            speedup_tolerance: float | None = None, allow_missing: bool | Collection[str] = False,
            update: bool = False, out=None) -> int:
    """Exit status: 0 passed (or baseline written), 1 regressed; RegressError when nothing is comparable."""
    out = out or sys.stdout
    existing = json.loads(baseline_path.read_text()) if baseline_path.exists() else None
    if existing is None and not update:
        raise RegressError(f"no baseline file {baseline_path}; write one from these runs with --update")
    if existing is not None and existing.get("format", 1) < RECORD_FORMAT:
        if not update:
            raise RegressError(f"{baseline_path} counts #MAT with each turn's prefill as a step (format 1); rewrite it "
                               f"from current runs with --update")
        existing = {key: value for key, value in existing.items() if key != "methods"}  # format-1 #MATs go
    tolerances = {**DEFAULT_TOLERANCES, **(existing or {}).get("tolerances", {})}
    if mat_tolerance is not None:
        tolerances["mean_accepted_tokens"] = mat_tolerance
    if speedup_tolerance is not None:
        tolerances["speedup"] = speedup_tolerance
    board = current_board(path)
    rows = rows_for_setting(board, existing.get("setting") if existing else None)
    setting = setting_of(rows.iloc[0])
    print(f"regress: {path} against {baseline_path} ({', '.join(f'{k}={v}' for k, v in setting.items())}; "
          f"tolerances: mean accepted tokens {tolerances['mean_accepted_tokens']:.0%}, "
          f"speedup {tolerances['speedup']:.0%})", file=out)
    if update:
        return update_from(rows, existing, tolerances, baseline_path, path, out)
    return gate(rows, existing, tolerances, allow_missing, f"python -m bench.regress {path} --baseline {baseline_path}",
                out)


def update_from(rows: pd.DataFrame, existing: dict | None, tolerances: dict, baseline_path: Path, source: Path,
                out) -> int:
    """update_baseline from the rows, unless some differ from vanilla (exit status 1)."""
    failures = [f for f in exact_match_findings(rows) if f.failed]
    for finding in failures:
        print(finding, file=out)
    if failures:
        print(f"regress: baseline NOT written: {len(failures)} method x task(s) differ from vanilla", file=out)
        return 1
    written = update_baseline(baseline_path, rows, existing, tolerances, source)
    print(f"regress: wrote {baseline_path} ({len(written['methods'])} methods)", file=out)
    return 0


def gate(rows: pd.DataFrame, baseline: dict, tolerances: dict, allow_missing: bool | Collection[str], command: str,
         out) -> int:
    """compare's findings, failures first, after what the runs hold of the baseline when they lack some of it (and
    `command` --allow-missing, which gates only that, when that failed); exit status 1 when any failed."""
    covered = coverage(rows, baseline)
    compared, entries = entry_count(covered.compared), entry_count(covered.compared) + entry_count(covered.missing)
    if not compared:
        raise RegressError(f"none of the baseline's {entries} method x task entries is in these runs (they hold "
                           f"{', '.join(sorted(set(rows.method)))}); --update writes a baseline of them")
    if covered.missing:
        print(f"regress: these runs hold {compared} of the baseline's {entries} method x task entries: "
              + "; ".join(f"{methods} on {tasks}" for tasks, methods in grouped(covered.compared).items()), file=out)
    findings = compare(rows, baseline, tolerances, allow_missing)
    for finding in sorted(findings, key=lambda f: (not f.failed, f.method, f.task)):
        print(finding, file=out)
    if any(f.failed and not f.method for f in findings):
        print(f"regress: to gate only the entries these runs hold: {command} --allow-missing", file=out)
    failed = sum(f.failed for f in findings)
    print(f"regress: {'FAILED' if failed else 'passed'}: {failed} problem(s); {compared} of {entries} baseline "
          f"method x task entries compared, {rows.method.nunique()} methods in the runs", file=out)
    return 1 if failed else 0
