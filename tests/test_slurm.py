"""Sweeps through SLURM, the parts that need no scheduler: tools/local_slurm.sh's configs, where a job runs and
claims its cores (bench.measure.scheduler), meta.json's scheduler keys, and the one-line refusal of a launcher whose
plugin is missing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bench.artifacts import PROJECT_ROOT
from bench.config import COMMAND_VARIABLE, missing_launcher, typed_command
from bench.measure.contention import available_cores
from bench.measure.scheduler import Placement, claim_scope, job_threads, placement, provenance_facts

SCRIPT = PROJECT_ROOT / "tools" / "local_slurm.sh"
SLURM_ARRAY_JOB = {"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "5",
                   "SLURMD_NODENAME": "node7", "SLURM_CPUS_PER_TASK": "3"}


def write_conf(tmp_path, **env):
    return subprocess.run(["bash", str(SCRIPT), "conf"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_CONF": str(tmp_path / "slurm.conf"),
                               "SLURM_LOCAL_STATE": str(tmp_path / "state"), **env})


def conf_values(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")


def test_local_cluster_conf_names_this_node_its_cores_and_memory_less_the_margin(tmp_path):
    assert write_conf(tmp_path, SLURM_LOCAL_MEM_MARGIN_MB="1000").returncode == 0
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    lines = (tmp_path / "slurm.conf").read_text().splitlines()
    cores = len(os.sched_getaffinity(0))
    assert f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cores} RealMemory={mem_kb // 1024 - 1000} State=UNKNOWN" in lines
    assert f"PartitionName=local Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in lines
    values = conf_values(tmp_path / "slurm.conf")
    assert (values["SelectType"], values["SelectTypeParameters"], values["TaskPlugin"]) == \
        ("select/cons_tres", "CR_Core", "task/affinity")
    assert values["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert values["StateSaveLocation"] == str(tmp_path / "state" / "ctld")
    dbd = conf_values(tmp_path / "slurmdbd.conf")
    assert (dbd["DbdAddr"], dbd["StorageType"]) == ("127.0.0.1", "accounting_storage/mysql")
    assert (tmp_path / "slurmdbd.conf").stat().st_mode & 0o777 == 0o600  # slurmdbd refuses a readable one


def test_local_cluster_conf_is_rewritten_as_its_own_but_never_over_someone_elses(tmp_path):
    assert write_conf(tmp_path).returncode == 0
    first = (tmp_path / "slurm.conf").read_text()
    assert write_conf(tmp_path).returncode == 0
    assert (tmp_path / "slurm.conf").read_text() == first
    (tmp_path / "slurm.conf").write_text("ClusterName=production\n")
    refused = write_conf(tmp_path)
    assert refused.returncode == 1
    assert refused.stderr == f"local_slurm.sh: {tmp_path / 'slurm.conf'} exists and is not ours: not overwriting it\n"
    assert (tmp_path / "slurm.conf").read_text() == "ClusterName=production\n"


@pytest.mark.parametrize("environ, expected", [
    (SLURM_ARRAY_JOB, Placement("slurm", "12_5", "node7", 3)),
    ({"SLURM_JOB_ID": "17", "SLURMD_NODENAME": "node7"}, Placement("slurm", "17", "node7", None)),
    ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242"}, Placement("local", "4242", "HOST", None)),
    ({}, Placement("none", None, "HOST", None)),
])
def test_placement_reads_the_schedulers_variables(environ, expected, monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "HOST")
    assert placement(environ) == expected


def test_a_slurm_job_claims_among_its_nodes_jobs_and_cores_a_local_one_among_this_processs(tmp_path):
    assert claim_scope(tmp_path, Placement("slurm", "12_5", "node7", 1)) == \
        (tmp_path / ".core_claims" / "node7", os.cpu_count())
    assert claim_scope(tmp_path, Placement("local", "4242", "HOST", None)) == \
        (tmp_path / ".core_claims", available_cores())


def test_a_slurm_job_times_on_exactly_the_cores_it_was_allotted():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert job_threads(Placement("slurm", "12_5", "node7", 1)) == 1 == torch.get_num_threads()
        assert job_threads(Placement("none", None, "HOST", None)) == 1  # no allotment: left as it is
    finally:
        torch.set_num_threads(before)


def test_meta_names_the_scheduler_job_node_and_the_sweeps_command():
    command = "python -m bench -m hydra/launcher=submitit_slurm method=pld,lookahead task=qa"
    assert provenance_facts({**SLURM_ARRAY_JOB, COMMAND_VARIABLE: command}) == \
        {"scheduler": "slurm", "job_id": "12_5", "node": "node7", "command": command}
    assert provenance_facts({})["command"] == typed_command()  # a run outside `python -m bench`
    assert typed_command(["/opt/py/bin/python3.11", "-m", "bench", "task=a b"]) == "python -m bench 'task=a b'"


@pytest.fixture
def no_submitit_plugin(monkeypatch):
    """hydra-submitit-launcher not importable, whether or not it is installed (or imported)."""
    for name in [n for n in sys.modules if n.startswith("hydra_plugins.hydra_submitit")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)


def test_a_launcher_whose_plugin_is_missing_is_named_with_the_install_command(no_submitit_plugin):
    line = 'hydra/launcher=submitit_slurm: needs the hydra-submitit-launcher plugin: pip install -e ".[sweeps]"'
    assert missing_launcher(["method=pld,lookahead", "hydra/launcher=submitit_slurm"]) == line
    assert missing_launcher(["method=pld,lookahead"]) is None
    assert missing_launcher(["hydra/launcher=basic"]) is None  # Hydra's own: no conf/hydra/launcher/basic.yaml


def test_a_sweep_through_a_missing_launcher_ends_in_one_error_line(no_submitit_plugin, monkeypatch, capsys):
    from bench.__main__ import main

    monkeypatch.setattr(sys, "argv", ["bench", "-m", "hydra/launcher=submitit_local", "method=vanilla,pld"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == \
        'error: hydra/launcher=submitit_local: needs the hydra-submitit-launcher plugin: pip install -e ".[sweeps]"\n'


def test_a_reports_table_names_the_nodes_its_runs_ran_on():
    import pandas as pd

    from bench.report.tables import node_names

    assert node_names(pd.Series(["node2", "node1", "node2", None])) == "node1, node2"
    assert node_names(pd.Series([f"n{i}" for i in range(6)])) == "6 nodes (n0, n1, n2, ...)"


class FinishedJob:
    """What the summary reads of a submitit job: its id, SLURM state and stderr log."""

    def __init__(self, job_id: str, state: str, stderr):
        self.job_id, self.state = job_id, state
        self.paths = type("Paths", (), {"stderr": stderr})()


def test_the_sweep_summary_says_why_each_failed_job_failed_and_where_its_log_is(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus

    from bench.measure.sweep_launcher import summary_line

    log = tmp_path / "log.err"
    log.write_text("loading\nerror: method.sizing=big: must be fixed or auto\n")
    done = JobReturn(overrides=["method=pld", "task=qa"], status=JobStatus.COMPLETED)
    user_error = JobReturn(overrides=["method=pld"], status=JobStatus.FAILED, _return_value=SystemExit(2))
    cancelled = JobReturn(overrides=["method=sps"], status=JobStatus.FAILED, _return_value=RuntimeError(
        "Job 7_2 (task: 0) with path /x/7_2_0_result.pkl\nhas not produced any output (state: CANCELLED by 0)"))
    crashed = JobReturn(overrides=["method=rest"], status=JobStatus.FAILED, _return_value=ValueError("bad\nmore"))
    quiet = tmp_path / "quiet.err"
    quiet.write_text("loading\n")
    assert summary_line(FinishedJob("7_0", "COMPLETED", log), done) == "7_0 COMPLETED method=pld task=qa"
    assert summary_line(FinishedJob("7_1", "FAILED", log), user_error) == \
        f"7_1 FAILED method=pld: method.sizing=big: must be fixed or auto (log: {log})"
    assert summary_line(FinishedJob("7_2", "CANCELLED by 0", quiet), cancelled) == \
        f"7_2 CANCELLED by 0 method=sps: the job ended without a result (cancelled, killed, out of memory or time) " \
        f"(log: {quiet})"
    assert summary_line(FinishedJob("7_3", "COMPLETED", quiet), crashed) == \
        f"7_3 FAILED method=rest: ValueError: bad (log: {quiet})"
