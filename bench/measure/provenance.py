"""What a run's meta.json says about where its numbers come from: config, code version, software, hardware, and
whether the machine starved it."""
from __future__ import annotations

import math
import platform
import resource
import socket
import subprocess
import time

import pandas as pd
import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from bench.artifacts import PROJECT_ROOT, drafter_source
from bench.blas import code_path_origin
from bench.measure.contention import available_cores, is_starved
from bench.measure.gpu import GpuMonitor
from bench.measure.scheduler import provenance_facts
from bench.models import cpu_bfloat16_support
from bench.planning.profile import blas_environment, device_name


def run_metadata(cfg: DictConfig, dtype: str, device: torch.device, started: float, gpu: GpuMonitor) -> dict:
    """What a reader needs to trust or reproduce the numbers: the composed config `cfg`, code version, software,
    hardware (the model's weights in `dtype` on `device`)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=PROJECT_ROOT, capture_output=True,
                                    text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "drafter_source": drafter_source(OmegaConf.to_container(cfg.method, resolve=True).get("drafter")),
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": device_name(device),
        "cpu_threads": torch.get_num_threads(),
        "blas_environment": blas_environment(device),  # MKL code-path variables set (CPU)
        "blas_chosen_by": code_path_origin() if device.type == "cpu" else None,  # harness | user | None
        "dtype": dtype,
        "cpu_bfloat16": cpu_bfloat16_support() if device.type == "cpu" else None,  # AMX / AVX512 bf16 flags
        "host": socket.gethostname(),
        **provenance_facts(),  # scheduler, job_id, node, command
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **gpu.report(),
    }


def starvation_facts(summary: pd.DataFrame | None, threshold: float) -> dict:
    """meta.json's starvation keys from the overall row: cpu_share and starved (null where they do not apply)."""
    share = math.nan if summary is None else float(summary.cpu_share.iloc[-1])
    return {"cpu_cores": available_cores(), "cpu_share": None if math.isnan(share) else round(share, 4),
            "starved": is_starved(share, threshold)}
