"""Committed records of an experiment's runs, the source of every generated table in README.md and docs/
(bench/report/docs_blocks.py).

`python -m bench.report <run folders> --record <experiment>` writes results/reference/<experiment>/<host>/: the
report's long table (leaderboard.csv, as `python -m bench.report` writes it) and meta.json (where, with what and by
which commands the runs were made); kilobytes, committed. <host> is the machine's label (host_label): the CPU model
and its threads (`amd-epyc-2t`) or the GPU's name, so records of one experiment on several machines sit side by side.
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd

from bench.artifacts import PROJECT_ROOT
from bench.config import typed_command
from bench.errors import ConfigError
from bench.planning.costmodel import device_slug
from bench.report.imports import with_imports
from bench.report.runs import SETTING_COLUMNS, load_runs
from bench.report.tables import leaderboard

REFERENCE_DIR = PROJECT_ROOT / "results" / "reference"
BOARD_FILE = "leaderboard.csv"
TEXT_COLUMNS = [*SETTING_COLUMNS[:3], "device_name", "source", "method", "task", "diverged_questions", "torch",
                "transformers", "finished", "runs"]  # read back as text, not as numbers (a diverged question's id)
META_FILE = "meta.json"  # the record's, not a run's: a record folder holds no answers.jsonl, so it is never a run


def host_label(meta: dict) -> str:
    """A run's machine as a folder name: `amd-epyc-2t` (CPU model, torch threads), `nvidia-h100-80gb-hbm3` (GPU)."""
    name = device_slug(str(meta.get("device_name") or meta.get("device") or "unknown"))
    threads = meta.get("cpu_threads")
    return f"{name}-{threads}t" if str(meta.get("device", "cpu")).startswith("cpu") and threads else name


def served_here(meta: dict) -> bool:
    """A run against a server the harness reached on this machine (its machine is the harness's host)."""
    url = str((meta.get("server") or {}).get("url") or "")
    return meta.get("backend") == "server" and urlparse(url).hostname in ("127.0.0.1", "localhost", "::1")


def machine_runs(metas: list[dict]) -> list[dict]:
    """The runs that describe the machine: all but those against a server on it (all, if there are only those)."""
    return [m for m in metas if not served_here(m)] or metas


def machine_label(metas: list[dict], where: Path) -> str:
    """The one machine of a record's runs: their host label, where runs against a server on the same machine (our
    engine beside vLLM's, bench.parity.engines) take the label of the engine's runs beside them. Runs of several
    machines are refused: each machine's runs make a record of their own."""
    own = machine_runs(metas)
    labels = sorted({host_label(m) for m in own})
    hosts = sorted({str(m.get("host")) for m in metas})
    if len(labels) > 1 or (len(own) < len(metas) and len(hosts) > 1):
        names = labels if len(labels) > 1 else hosts
        raise ConfigError(f"{where}: runs of several machines ({', '.join(names)}): record each machine's "
                          f"runs from a folder of their own")
    return labels[0]


def _joined(values) -> str:
    return ", ".join(sorted({str(v) for v in values if v is not None}))


def record_meta(experiment: str, metas: list[dict], command: str, label: str) -> dict:
    """meta.json of a record of the machine `label` (machine_label): the experiment, the machine, the software, the
    code, the dates and the commands."""
    dates = sorted(d for m in metas for d in (m.get("started"), m.get("finished")) if d)
    own = machine_runs(metas)
    return {
        "experiment": experiment,
        "host_label": label,
        "hosts": _joined(m.get("host") for m in metas),
        "device": _joined(m.get("device") for m in own),
        "device_name": _joined(m.get("device_name") for m in own),
        "cpu_threads": own[0].get("cpu_threads"),
        "blas_environment": _joined(json.dumps(m["blas_environment"], sort_keys=True) for m in own
                                    if m.get("blas_environment") is not None) or None,
        "torch": _joined(m.get("torch") for m in metas),
        "transformers": _joined(m.get("transformers") for m in metas),
        "git_commit": _joined(m.get("git_commit") for m in metas),
        "git_dirty": any(bool(m.get("git_dirty")) for m in metas),
        "first_started": dates[0] if dates else None,
        "last_finished": dates[-1] if dates else None,
        "commands": sorted({typed_command(m["command"]) for m in metas if m.get("command")}),
        "recorded_with": command,
        "runs": len(metas),
    }


def write_record(results_dir: Path, experiment: str, reference_dir: Path, command: str) -> Path:
    """The record of the runs under `results_dir` (the latest per setting, method and task, as the report picks
    them), written to reference_dir/<experiment>/<host label>/ with the `command` that records them; returns that
    folder (machine_label)."""
    runs = load_runs(results_dir)
    if runs.empty:
        raise ConfigError(f"no runs (answers.jsonl + meta.json) under {results_dir}")
    board = leaderboard(runs)
    used = sorted({path for paths in board.runs for path in paths.split(";")})
    metas = [json.loads((Path(path) / "meta.json").read_text()) for path in used]
    label = machine_label(metas, results_dir)
    folder = Path(reference_dir) / experiment / label
    folder.mkdir(parents=True, exist_ok=True)
    with_imports(board, None).drop(columns="setting").to_csv(folder / BOARD_FILE, index=False)
    meta = record_meta(experiment, metas, command, label)
    (folder / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def read_record(folder: Path) -> tuple[list[pd.DataFrame], dict]:
    """A record's leaderboard, one DataFrame per setting (model, device, dtype, ...), in the order written, and its
    meta.json."""
    board = pd.read_csv(folder / BOARD_FILE, dtype=dict.fromkeys(TEXT_COLUMNS, str))
    board = board[board.source == "specbench"] if "source" in board else board
    settings = [group for _, group in board.groupby(SETTING_COLUMNS, sort=False, dropna=False)]
    return settings, json.loads((folder / META_FILE).read_text())
