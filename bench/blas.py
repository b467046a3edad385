"""MKL's CPU code path. On AMD CPUs MKL's default path makes a [M, k] x [k, n] product with 2 <= M <= 16 (a
verification forward of a few tokens) about 1.7-2x as slow as M = 1; `MKL_CBWR=AVX2` removes most of that, with
results as exact as before (docs/cost-model.md). The harness sets it itself, on importing `bench` (MKL reads it at
its first call), unless the user chose a code path: `MKL_CBWR=AUTO` keeps MKL's default."""
from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# MKL settings that pick its CPU code path (profiles and meta.json record the ones set).
BLAS_ENVIRONMENT = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")
AMD_CODE_PATH = {"MKL_CBWR": "AVX2"}
# Set beside AMD_CODE_PATH when the harness chose it, so that its child processes and meta.json can tell.
CHOSEN_BY_HARNESS = "SPECBENCH_BLAS_CHOSEN"


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's vendor_id (`AuthenticAMD`, `GenuineIntel`), None where /proc/cpuinfo does not say."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), None)


def choose_code_path(environ: MutableMapping[str, str] = os.environ, vendor: str | None = None) -> None:
    """On an AMD CPU with none of BLAS_ENVIRONMENT set, set AMD_CODE_PATH (and CHOSEN_BY_HARNESS) in `environ`."""
    if any(environ.get(name) for name in BLAS_ENVIRONMENT):
        return
    if (vendor or cpu_vendor()) == "AuthenticAMD":
        environ.update(AMD_CODE_PATH)
        environ[CHOSEN_BY_HARNESS] = "1"


def code_path_origin(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Who chose MKL's code path: `harness`, `user`, or None (MKL's default)."""
    if not any(environ.get(name) for name in BLAS_ENVIRONMENT):
        return None
    return "harness" if environ.get(CHOSEN_BY_HARNESS) else "user"
