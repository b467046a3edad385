"""How hydra/launcher=submitit_slurm (hydra_plugins/specbench_sweeps) runs a sweep: as hydra-submitit-launcher does,
except that it waits for every job (the plugin stops at the first that did not finish) and ends with the sweep's
summary, one line per job (its SLURM job id, state, overrides and, for a job that failed, why and where its log is),
logged and written to <hydra.sweep.dir>/summary.txt. A job requeued after pre-emption or its time limit (submitit's
checkpoint) counts as the job it continues."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


def launch_every_job(plugin, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Submit one SLURM job per override list as hydra-submitit-launcher's `plugin` would (each job runs `plugin`),
    wait for all of them, write and log the summary; the JobReturns, a FAILED one for a job that ended without."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params = dict(plugin.params)
    executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in shared else f"slurm_{key}": value for key, value in params.items()})
    sweep_dir = Path(str(plugin.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jobs = executor.map_array(plugin, *zip(*[
        (list(overrides), "hydra.sweep.dir", initial_job_idx + n, f"job_id_for_{initial_job_idx + n}",
         Singleton.get_state()) for n, overrides in enumerate(job_overrides)]))
    log.info(f"submitted {len(jobs)} SLURM job(s) {jobs[0].job_id.split('_')[0]}; sweep output dir {sweep_dir}")
    returns = [job_return(job, overrides) for job, overrides in zip(jobs, job_overrides)]
    summary = "\n".join(summary_line(job, ret) for job, ret in zip(jobs, returns))
    (sweep_dir / "summary.txt").write_text(summary + "\n")
    log.info(f"sweep summary ({sweep_dir / 'summary.txt'}):\n{summary}")
    return returns


def job_return(job, overrides: Sequence[str]) -> JobReturn:
    """The job's JobReturn once it has ended; a job that ended without one (cancelled, killed, exited) is FAILED with
    submitit's error as its value."""
    from submitit.core.utils import UncompletedJobError

    try:
        return job.results()[0]
    except UncompletedJobError as err:
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=err)


def summary_line(job, ret: JobReturn) -> str:
    """`<job id> <STATE> <overrides>`, and for a failed job `: <why> (log: <stderr file>)`."""
    overrides = " ".join(filter_overrides(ret.overrides or []))
    if ret.status == JobStatus.COMPLETED:
        return f"{job.job_id} COMPLETED {overrides}"
    state = "FAILED" if job.state == "COMPLETED" else job.state  # the job's process ended well, its run did not
    return f"{job.job_id} {state} {overrides}: {failure_reason(job, ret._return_value)} (log: {job.paths.stderr})"


def failure_reason(job, error: BaseException) -> str:
    """The `error:` lines the job printed (a user error), else what the exception says first."""
    try:
        printed = [line for line in job.paths.stderr.read_text().splitlines() if line.startswith("error: ")]
    except OSError:
        printed = []
    if printed:
        return "; ".join(line.removeprefix("error: ") for line in printed)
    if "has not produced any output" in str(error):  # submitit: no result file
        return "the job ended without a result (cancelled, killed, out of memory or time)"
    first = next((line for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}"
