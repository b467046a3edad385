"""Timing of generation only: wall clock (with device synchronisation on CUDA) and, on CPU, process CPU time."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    """One timed block: wall seconds; on CPU also the process's CPU seconds and torch's intra-op thread count."""

    wall: float = 0.0
    cpu: float | None = None  # None on CUDA: the device does the work, host CPU time says nothing about it
    threads: int | None = None


def device_time(device: torch.device, clock=None) -> float:
    """`clock()` (default time.perf_counter) once the device's queued work is done (CUDA is synchronised first)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (clock or time.perf_counter)()


@contextmanager
def timed(device: torch.device):
    """Yields a Timing that holds the elapsed seconds once the block ends (CUDA work included)."""
    timing = Timing()
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
    else:
        timing.threads = torch.get_num_threads()
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        if on_cuda:
            torch.cuda.synchronize(device)
        timing.wall = time.perf_counter() - start
        if not on_cuda:
            timing.cpu = time.process_time() - cpu_start
