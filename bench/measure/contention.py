"""Was the benchmark given the CPU it asked for? Warnings about a busy machine, and the CPU share of timed turns.

CPU share = process CPU time / (wall time x min(torch threads, cores available to the process)), summed over
every timed turn (all repeats). On a quiet machine it is close to 1 (lower only where torch's threads idle for lack
of parallel work); another job on the same cores pulls it down, and a run below `starvation_threshold` is starved:
its timings, and so its speedups, are not to be trusted. On CUDA the device is timed, so the check does not apply.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

DEFAULT_STARVATION_THRESHOLD = 0.75  # one other job as busy as this one halves the share
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # "max 100000" or "<quota> <period>" (cgroup v2)
ADVICE = ("time on a quiet machine, or set OMP_NUM_THREADS so that every job's threads together fit the cores "
          "(docs/metrics.md)")


def available_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (containers) where set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes), None where the OS does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def start_warnings(threads: int, cores: int, load: float | None, on_cuda: bool) -> list[str]:
    """What is wrong with the machine before timing starts: already busy, or more torch threads than cores."""
    if on_cuda:
        return []
    found = []
    if load is not None and load > cores:
        found.append(f"the machine is busy before the run starts: load average {load:.2f} > {cores} cores; "
                     f"timings will be slower and erratic; {ADVICE}")
    if threads > cores:
        found.append(f"torch uses {threads} threads but this process may use {cores} cores; threads will wait on "
                     f"each other; set OMP_NUM_THREADS={cores} (or fewer)")
    return found


def cpu_share(records: Iterable[dict]) -> float:
    """CPU share of every timed turn (all repeats) of `records`; NaN when none recorded CPU time (CUDA runs)."""
    used = available = 0.0
    for record in records:
        choice = record["choices"][0]
        if "cpu_times" not in choice:
            continue
        for walls, cpus, threads, cores in zip(choice["wall_times"], choice["cpu_times"], choice["threads"],
                                               choice["cores"]):
            used += sum(cpus)
            available += sum(walls) * min(threads, cores)
    return used / available if available else math.nan


def is_starved(share: float, threshold: float) -> bool | None:
    """True below the threshold; None where the share is unknown (CUDA)."""
    return None if math.isnan(share) else bool(share < threshold)


def verdict(share: float, threshold: float) -> str:
    """The one line said at the end of a run about its CPU share."""
    if math.isnan(share):
        return "CPU share: n/a (timed on the GPU with device synchronisation; the starvation check is for CPU runs)"
    if share < threshold:
        return (f"WARNING: STARVED RUN: the process had {share:.0%} of the CPU its threads could use while timing "
                f"(starvation_threshold {threshold:.0%}); another job took the rest, so these timings and speedups "
                f"are not to be trusted; {ADVICE}")
    return f"CPU share while timing: {share:.0%} (not starved; starvation_threshold {threshold:.0%})"
