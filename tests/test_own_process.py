"""A compiled run in a process of its own (bench/measure/own_process.py): which runs get one, a sweep's compiled job
run that way end to end, and the child's errors back in the caller as they would be raised in process."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.artifacts import PROJECT_ROOT
from bench.errors import MissingArtifactError
from bench.measure.own_process import RunFailed, own_process_needed, run_in_own_process
from tests.conftest import tiny_overrides


@pytest.mark.parametrize(("multirun", "launcher", "compiled", "own"), [
    (True, "basic", True, True),
    (True, "joblib", True, True),  # joblib's workers are reused from job to job
    (True, "submitit_local", True, False),  # a process per job already
    (True, "submitit_slurm", True, False),
    (True, "basic", False, False),  # eager runs keep nothing after their run
    (False, "basic", True, False),  # one run: the process ends with it
])
def test_only_compiled_jobs_of_a_sweep_in_one_process_get_a_process_of_their_own(multirun, launcher, compiled, own):
    assert own_process_needed(multirun, launcher, compiled) is own


def test_a_compiled_sweep_job_runs_in_its_own_process_and_matches_vanilla(tiny_checkpoint, tmp_path):
    tiny = [o for o in tiny_overrides(tiny_checkpoint, tmp_path / "runs") if not o.startswith("out_dir=")]
    done = subprocess.run([sys.executable, "-m", "bench", "-m", *tiny, "method=pld", "task=qa", "task.limit=2",
                           "engine.compile=on", f"out_dir={tmp_path}/runs/${{method.name}}",
                           f"hydra.sweep.dir={tmp_path}/sweep"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stderr.splitlines()
    assert said.count("engine.compile: a compiled job of this sweep runs in a process of its own (its graphs would "
                      "stay in the sweep's: bench/measure/own_process.py)") == 1
    assert [line.split("'s graphs")[0] for line in said if line.startswith("engine.compile: the ")] == \
        ["engine.compile: the method", "engine.compile: the baseline"]
    meta = json.loads((tmp_path / "runs" / "pld" / "meta.json").read_text())
    assert meta["compiled"] and meta["command"].startswith("python -m bench -m ")  # the sweep's, not the child's
    answers = [json.loads(line) for line in (tmp_path / "runs" / "pld" / "answers.jsonl").read_text().splitlines()]
    baseline = [json.loads(line) for line in (tmp_path / "runs" / "pld" / "baseline.jsonl").read_text().splitlines()]
    assert len(answers) == 2
    assert [a["choices"][0]["token_ids"] for a in answers] == [b["choices"][0]["token_ids"] for b in baseline]


def one_thread_env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_a_missing_artifact_comes_back_with_its_message(compose, tmp_path):
    cfg = compose("method=rest", f"datastore.path={tmp_path}/no-datastore.idx", "datastore.auto_build=false",
                  "task=qa", "task.limit=1")
    with pytest.raises(MissingArtifactError, match="no-datastore.idx"):
        run_in_own_process(cfg, 1)


def test_a_bad_setting_in_the_child_is_its_error_lines_and_status_2(compose, capfd):
    with pytest.raises(RunFailed) as failed:
        run_in_own_process(compose("task=qa", "gen.max_new_tokens=0"), 1)
    assert failed.value.code == 2
    assert any(line.startswith("error: ") and "max_new_tokens" in line for line in capfd.readouterr().err.splitlines())
