"""Sweeps through the one-node SLURM cluster of tools/local_slurm.sh (skipped, in one line, when it is not up):
a two-job sweep of the tiny model, each job with its own run folder, SLURM job id and a line in sacct; then a job
pre-empted mid-run (SIGUSR2, as SLURM signals before pre-emption) that submitit requeues and that resumes its
answers.jsonl with every question exactly once."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.config import typed_command
from bench.records import read_jsonl
from tests.conftest import tiny_overrides


def why_no_cluster() -> str | None:
    """Why these tests cannot run here, or None."""
    try:
        plugin = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher")
    except ModuleNotFoundError:
        plugin = None
    if plugin is None:
        return 'no hydra-submitit-launcher: pip install -e ".[sweeps]"'
    if shutil.which("sinfo") is None:
        return "no SLURM here: bash tools/local_slurm.sh start installs and starts a one-node cluster"
    nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if nodes.returncode != 0 or not {"idle", "mixed", "allocated"} & set(nodes.stdout.split()):
        return "no SLURM node up: bash tools/local_slurm.sh start"
    return None


pytestmark = pytest.mark.slurm
if (REASON := why_no_cluster()) is not None:
    pytest.skip(REASON, allow_module_level=True)


def sweep_command(checkpoint: Path, tmp_path: Path, *overrides: str) -> list[str]:
    tiny = [o for o in tiny_overrides(checkpoint, tmp_path / "runs") if not o.startswith("out_dir=")]
    return [sys.executable, "-m", "bench", "-m", "hydra/launcher=submitit_slurm", *tiny,
            f"out_dir={tmp_path}/runs/${{method.name}}-${{task.name}}", f"hydra.sweep.dir={tmp_path}/sweep",
            "hydra.launcher.timeout_min=30", *overrides]


def question_ids(run_dir: Path) -> list[int]:
    return [r["question_id"] for r in read_jsonl(run_dir / "answers.jsonl")]


def job_ids(sweep: Path) -> list[str]:
    return sorted(p.name for p in (sweep / ".submitit").iterdir() if "_" in p.name and p.is_dir())  # <array>_<task>


def test_a_two_job_sweep_runs_each_job_through_slurm_in_its_own_folder(tiny_checkpoint, tmp_path):
    command = sweep_command(tiny_checkpoint, tmp_path, "method=vanilla,pld", "task=qa", "task.limit=2")
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = job_ids(tmp_path / "sweep")
    assert len(jobs) == 2
    for job, method in zip(jobs, ["vanilla", "pld"]):
        run_dir = tmp_path / "runs" / f"{method}-qa"
        assert len(question_ids(run_dir)) == 2 == len(set(question_ids(run_dir)))
        meta = json.loads((run_dir / "meta.json").read_text())
        assert (meta["scheduler"], meta["job_id"], meta["cpu_threads"]) == ("slurm", job, 1)
        assert meta["command"] == typed_command(command)  # as typed: `python -m bench ...`
    summary = (tmp_path / "sweep" / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[job, "COMPLETED"] for job in jobs]
    assert accounted(jobs) == [f"{job}|COMPLETED" for job in jobs]


def accounted(jobs: list[str]) -> list[str]:
    """sacct's `<job id>|<state>` of the jobs' array once none is running any more (the sweep ends when the jobs
    have written their results, a moment before SLURM records their end), 30 s at most."""
    for _ in range(60):
        listed = sorted(subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", jobs[0].split("_")[0]],
                                       capture_output=True, text=True, timeout=30).stdout.split())
        if not any(line.endswith(("|RUNNING", "|COMPLETING", "|PENDING")) for line in listed):
            break
        time.sleep(0.5)
    return listed


def test_a_job_preempted_mid_run_is_requeued_and_answers_every_question_once(tiny_checkpoint, tmp_path):
    command = sweep_command(tiny_checkpoint, tmp_path, "method=pld", "task=qa", "task.limit=12",
                            "gen.max_new_tokens=96", "repeats=3")  # about 0.7 s a question
    sweep = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    answers = tmp_path / "runs" / "pld-qa"
    try:
        deadline = time.monotonic() + 120
        while not question_ids(answers) and time.monotonic() < deadline:
            time.sleep(0.2)
        answered_before = len(question_ids(answers))
        [job] = [p.name for p in (tmp_path / "sweep" / ".submitit").iterdir() if p.is_dir()]  # one job: no array
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        start_when_requeued(job)
        output, _ = sweep.communicate(timeout=120)
    finally:
        sweep.kill()
    assert 0 < answered_before < 12, f"the job had answered {answered_before} of 12 questions when signalled"
    assert sweep.returncode == 0, output[-3000:]
    assert sorted(question_ids(answers)) == sorted(set(question_ids(answers))) and len(question_ids(answers)) == 12
    logs = "".join(path.read_text() for path in (tmp_path / "sweep" / ".submitit" / job).glob("*_log.*"))
    assert "this job is preempted" in logs and f"Requeued job {job}" in logs
    assert "Restarts=1" in subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout


def start_when_requeued(job: str) -> None:
    """Once SLURM has requeued `job`, make it eligible at once (SLURM holds a requeued job about two minutes)."""
    for _ in range(120):
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        if "Restarts=1" in shown and "JobState=PENDING" in shown:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
            return
        time.sleep(0.25)
