"""Jobs of one sweep must not time on the same cores at once: each CPU job of a Hydra multirun claims its torch
threads in the sweep's folder (`<hydra.sweep.dir>/.core_claims/<pid>`), and a job whose threads do not fit beside the
live claims of its siblings is refused before it loads anything (the starvation check would only flag it after)."""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from bench.errors import ConfigError


def live_claims(folder: Path) -> dict[int, int]:
    """{pid: threads} of the claims in `folder` whose process still runs (a dead job's claim is removed)."""
    claims = {}
    for path in folder.glob("[0-9]*"):
        pid = int(path.name)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass
        try:
            claims[pid] = int(path.read_text() or 0)
        except (OSError, ValueError):
            continue
    return claims


@contextmanager
def claim_cores(folder: Path, threads: int, cores: int):
    """`with claim_cores(folder, threads, cores):` holds this process's claim of `threads` of the host's `cores`
    while the block runs; ConfigError when the live claims of the other jobs leave fewer than `threads` free."""
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / str(os.getpid())
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # check and claim as one step: jobs start at the same instant
        others = {pid: n for pid, n in live_claims(folder).items() if pid != os.getpid()}
        if sum(others.values()) + threads > cores:
            raise ConfigError(
                f"another job of this sweep is timing on the same cores: {sum(others.values())} threads of "
                f"{len(others)} running job(s) (pids {', '.join(map(str, sorted(others)))}) plus this job's "
                f"{threads} exceed the {cores} cores, which makes timings erratic; run the sweep one job at a time (no "
                f"hydra/launcher=...), or give each job OMP_NUM_THREADS=<cores // jobs> "
                f"(joblib: hydra.launcher.n_jobs)")
        mine.write_text(str(threads))
    try:
        yield
    finally:
        mine.unlink(missing_ok=True)
