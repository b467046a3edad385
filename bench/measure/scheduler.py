"""Which scheduler started this run (SLURM, submitit's local executor, or none) and what it gave the job, read from the
variables the scheduler sets; where a sweep's job claims its cores (bench.measure.core_claims)."""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.config import COMMAND_VARIABLE, typed_command
from bench.measure.contention import available_cores


@dataclass(frozen=True)
class Placement:
    """Where a run runs: `scheduler` slurm, local (submitit's local executor) or none; its `job_id` (SLURM's
    `<array job>_<task>` for a job of an array), the `node`, and the `cpus` the scheduler allotted it (None: not
    set)."""
    scheduler: str
    job_id: str | None
    node: str
    cpus: int | None


def placement(environ: Mapping[str, str] = os.environ) -> Placement:
    """This process's Placement, from `environ`."""
    node = socket.gethostname()
    if "SLURM_JOB_ID" in environ:
        array_job, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{array_job}_{task}" if array_job and task else environ["SLURM_JOB_ID"]
        cpus = environ.get("SLURM_CPUS_PER_TASK")
        return Placement("slurm", job_id, environ.get("SLURMD_NODENAME", node), int(cpus) if cpus else None)
    if environ.get("SUBMITIT_EXECUTOR") == "local" or "SUBMITIT_LOCAL_JOB_ID" in environ:
        return Placement("local", environ.get("SUBMITIT_LOCAL_JOB_ID"), node, None)
    return Placement("none", None, node, None)


def job_threads(where: Placement) -> int:
    """The torch threads of this job: set to the cores SLURM allotted it where it allotted some (sbatch's
    --cpus-per-task), so the job times on exactly the cores it holds; else torch's own count (OMP_NUM_THREADS)."""
    import torch

    if where.cpus and torch.get_num_threads() != where.cpus:
        torch.set_num_threads(where.cpus)
    return torch.get_num_threads()


def claim_scope(sweep_dir: Path, where: Placement) -> tuple[Path, int]:
    """(the folder a sweep's job claims its threads in, the cores they are claimed among). A SLURM job is pinned to its
    own cores on a node it may share with its siblings: it claims among the node's cores, beside that node's jobs
    only; a local job claims among the cores this process may run on."""
    if where.scheduler == "slurm":
        return sweep_dir / ".core_claims" / where.node, os.cpu_count() or 1
    return sweep_dir / ".core_claims", available_cores()


def provenance_facts(environ: Mapping[str, str] = os.environ) -> dict:
    """meta.json's scheduler keys: scheduler, job_id, node, and the command the run (or its sweep) was started
    with."""

    where = placement(environ)
    return {"scheduler": where.scheduler, "job_id": where.job_id, "node": where.node,
            "command": environ.get(COMMAND_VARIABLE) or typed_command()}
