"""Timing of generation only: wall clock (with device synchronisation on CUDA) and, on CPU, process CPU time;
and the phase timer of a turn (prefill, draft, verify, accept)."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from bench.records import PHASES


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


Clock = Callable[[], float]  # seconds, from any fixed origin


class PhaseTimer:
    """Seconds per phase of a turn: `lap(phase)` charges the time since the previous lap to `phase`; `seconds`
    (read once the turn is over) sums them.

    On CUDA (or with `event` given) each lap records an event on the current stream, `event()` returning an object
    like torch.cuda.Event(enable_timing=True): record(), synchronize(), elapsed_time(other) in ms. Nothing waits for
    the device during the turn; `seconds` waits for the last event once and reads the gaps, so a phase is charged
    for the device time between its boundaries. Elsewhere each lap reads `clock` (default time.perf_counter), which
    tests replace with a fake clock. `mark()` and `since_start(mark)` time other moments of the turn the same way."""

    def __init__(self, device: torch.device, clock: Clock | None = None, event: Callable | None = None):
        if event is None and clock is None and device.type == "cuda":
            event = functools.partial(torch.cuda.Event, enable_timing=True)
        self.clock, self.event = clock or time.perf_counter, event
        self._laps: list[tuple[str, object]] = []
        self._latest = self._start = self.mark()

    def mark(self):
        """A stamp of now: a clock reading, or a recorded event."""
        if self.event is None:
            stamp = self.clock()
        else:
            stamp = self.event()
            stamp.record()
        self._latest = stamp
        return stamp

    def lap(self, phase: str) -> None:
        self._laps.append((phase, self.mark()))

    def _between(self, begin, end) -> float:
        return end - begin if self.event is None else begin.elapsed_time(end) / 1e3

    def _wait(self) -> None:
        if self.event is not None:
            self._latest.synchronize()

    def since_start(self, stamp) -> float:
        """Seconds from the timer's start to `stamp` (call after the turn)."""
        self._wait()
        return self._between(self._start, stamp)

    @property
    def seconds(self) -> dict[str, float]:
        """PHASES -> seconds charged so far (call after the turn: on CUDA it waits for the device)."""
        self._wait()
        seconds, last = dict.fromkeys(PHASES, 0.0), self._start
        for phase, stamp in self._laps:
            seconds[phase] += self._between(last, stamp)
            last = stamp
        return seconds
