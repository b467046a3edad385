"""Sweeps refuse to time two jobs on the same cores (bench/measure/core_claims.py): claims of live jobs count,
dead jobs' claims are dropped, and a CPU job of a multirun whose threads do not fit is refused with exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.errors import ConfigError
from bench.measure.core_claims import claim_cores, live_claims


@pytest.fixture
def sibling():
    """A live process standing for another job of the sweep."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process.pid
    process.kill()
    process.wait()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_job_that_fits_beside_its_siblings_claims_its_threads_until_it_ends(tmp_path, sibling):
    (tmp_path / str(sibling)).write_text("1")
    with claim_cores(tmp_path, threads=1, cores=2):
        assert live_claims(tmp_path) == {sibling: 1, os.getpid(): 1}
    assert live_claims(tmp_path) == {sibling: 1}


def test_a_job_that_does_not_fit_is_refused_naming_the_other_jobs(tmp_path, sibling):
    (tmp_path / str(sibling)).write_text("2")
    with pytest.raises(ConfigError) as err:
        with claim_cores(tmp_path, threads=1, cores=2):
            pass
    assert f"(pids {sibling})" in str(err.value) and "OMP_NUM_THREADS=<cores // jobs>" in str(err.value)
    assert not (tmp_path / str(os.getpid())).exists()


def test_claims_of_ended_jobs_do_not_count(tmp_path):
    gone = dead_pid()
    (tmp_path / str(gone)).write_text("2")
    with claim_cores(tmp_path, threads=2, cores=2):
        assert live_claims(tmp_path) == {os.getpid(): 2}
    assert not (tmp_path / str(gone)).exists()


def test_a_multirun_job_on_claimed_cores_exits_2(tiny_checkpoint, tmp_path, sibling):
    from tests.conftest import tiny_overrides

    sweep = tmp_path / "sweep"
    (sweep / ".core_claims").mkdir(parents=True)
    (sweep / ".core_claims" / str(sibling)).write_text("64")  # more threads than any host has cores
    done = subprocess.run([sys.executable, "-m", "bench", "-m", *tiny_overrides(tiny_checkpoint, tmp_path / "run"),
                           "method=vanilla", "task=qa", "task.limit=1", f"hydra.sweep.dir={sweep}"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "error: another job of this sweep is timing on the same cores: 64 threads" in done.stderr
    assert not (tmp_path / "run" / "answers.jsonl").exists()


def test_a_sequential_multirun_runs_every_job_and_leaves_no_claim(tiny_checkpoint, tmp_path):
    from tests.conftest import tiny_overrides

    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny_overrides(tiny_checkpoint, tmp_path / "run") if not o.startswith("out_dir=")]
    done = subprocess.run([sys.executable, "-m", "bench", "-m", *overrides, "method=vanilla,pld", "task=qa",
                           "task.limit=1", f"out_dir={tmp_path}/runs/${{method.name}}", f"hydra.sweep.dir={sweep}"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all((tmp_path / "runs" / m / "answers.jsonl").exists() for m in ("vanilla", "pld"))
    assert [p.name for p in (sweep / ".core_claims").iterdir()] == [".lock"]
