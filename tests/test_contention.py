"""bench.measure.contention: the busy-machine warnings, cores under a cgroup quota, and CPU share from hand-built
records."""
from __future__ import annotations

import math

import pytest

from bench.measure import contention
from bench.measure.contention import cpu_share, is_starved, start_warnings, verdict


def timed_record(walls: list[list[float]], cpus: list[list[float]] | None, threads: int, cores: int) -> dict:
    """A record whose turns were timed once per repeat: walls[turn][repeat] wall seconds, cpus the CPU seconds."""
    choice = {"wall_time": [sorted(w)[len(w) // 2] for w in walls], "wall_times": walls}
    if cpus is not None:
        choice.update(cpu_times=cpus, threads=[threads] * len(walls), cores=[cores] * len(walls))
    return {"choices": [choice]}


def test_cpu_share_counts_every_repeat_and_caps_threads_at_the_cores():
    # 2 turns x 2 repeats: 4 s of wall time; 4 threads on 2 cores could use 8 CPU seconds, had 6
    record = timed_record([[1.0, 1.0], [1.0, 1.0]], [[2.0, 2.0], [1.0, 1.0]], threads=4, cores=2)
    assert cpu_share([record]) == pytest.approx(6 / 8)
    # a second record of 1 thread, 2 s wall, 0.5 s CPU: (6 + 0.5) / (8 + 2)
    assert cpu_share([record, timed_record([[2.0]], [[0.5]], 1, 2)]) == pytest.approx(6.5 / 10)


def test_cpu_share_does_not_apply_without_cpu_times():
    share = cpu_share([timed_record([[1.0]], None, 1, 2)])  # a CUDA run, or a record from before the check
    assert math.isnan(share) and is_starved(share, 0.5) is None
    assert verdict(share, 0.5).startswith("CPU share: n/a")


def test_starved_below_the_threshold_only():
    assert is_starved(0.3, 0.5) is True and is_starved(0.5, 0.5) is False
    assert verdict(0.3, 0.5).startswith("WARNING: STARVED RUN: the process had 30% of the CPU")
    assert "not starved" in verdict(0.93, 0.5)


def test_start_warnings_for_a_busy_machine_and_too_many_threads():
    assert start_warnings(threads=2, cores=2, load=0.4, on_cuda=False) == []
    busy, = start_warnings(threads=2, cores=2, load=3.5, on_cuda=False)
    assert busy.startswith("the machine is busy before the run starts: load average 3.50 > 2 cores")
    many, = start_warnings(threads=8, cores=2, load=None, on_cuda=False)
    assert "torch uses 8 threads but this process may use 2 cores" in many and "OMP_NUM_THREADS=2" in many
    assert start_warnings(threads=8, cores=2, load=9.0, on_cuda=True) == []


def test_available_cores_honours_a_cgroup_quota(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(contention, "CGROUP_CPU_MAX", cpu_max)
    monkeypatch.setattr(contention.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert contention.available_cores() == 4  # no cgroup file
    cpu_max.write_text("max 100000\n")
    assert contention.available_cores() == 4
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs of quota: 2 threads can run
    assert contention.available_cores() == 2
