"""Wall-clock timing of generation only, with device synchronisation on CUDA."""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch


@contextmanager
def timed(device: torch.device):
    """Yields a one-item list that holds the elapsed seconds once the block ends (CUDA work included)."""
    elapsed = [0.0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed[0] = time.perf_counter() - start
