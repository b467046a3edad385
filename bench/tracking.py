"""`tracking=mlflow`: a finished run logged to MLflow (experiment `specbench`, at `tracking_uri`; by default a local
mlruns/ folder under the working directory): its settings as params (method, model, task, generation settings, the
drafter's knobs), the overall row of its summary as metrics (speedup, mean_accepted_tokens, tokens_per_s, ...) and
its summary.csv and meta.json as artifacts. mlflow is imported here only, and only when asked for: it is the
optional `tracking` extra (`pip install -e ".[tracking]"`); without it tracking=mlflow is refused before the run."""
from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path

import pandas as pd

from bench.errors import ConfigError
from bench.settings import RunSettings

TRACKINGS = ("none", "mlflow")
EXPERIMENT = "specbench"
MISSING = 'tracking=mlflow: mlflow is not installed; pip install -e ".[tracking]"'


def mlflow_installed() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def tracking_uri(uri: str | None) -> str:
    """`tracking_uri`, or a local mlruns/ folder under the working directory."""
    return uri or (Path.cwd() / "mlruns").as_uri()


def run_params(settings: RunSettings, method: str) -> dict[str, str]:
    """The run's settings as MLflow params: what it ran, on what, how it decoded, and the drafter's knobs."""
    gen = settings.generation
    params = {"method": method, "model": settings.model.name, "dtype": settings.model.dtype,
              "task": settings.task.name, "task.limit": settings.task.limit, "backend": settings.backend,
              "device": settings.device, "seed": settings.seed, "repeats": settings.repeats,
              "baseline": settings.baseline, "method.sizing": settings.method.sizing,
              "gen.max_new_tokens": gen.max_new_tokens, "gen.batch_size": gen.batch_size,
              "gen.temperature": gen.temperature, "gen.top_k": gen.top_k, "gen.top_p": gen.top_p,
              "out_dir": settings.out_dir}
    drafter = settings.method.drafter
    if drafter is not None:
        params["method.drafter._target_"] = drafter.target
        params.update({f"method.drafter.{key}": value for key, value in sorted(drafter.knobs.items())})
    return {key: str(value)[:6000] for key, value in params.items()}  # MLflow keeps a param's first 6000 characters


def overall_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """The summary's overall row: every number it has (NaN left out), flags as 0/1, each under its column's name
    (characters MLflow refuses in a key as `_`)."""
    overall = summary[summary.task == "overall"].iloc[0]
    metrics = {}
    for key, value in overall.items():
        if value is None or isinstance(value, str):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            metrics[re.sub(r"[^\w\-. /]", "_", str(key))] = number
    return metrics


def track_run(settings: RunSettings, summary: pd.DataFrame | None, out_dir: Path) -> str | None:
    """Log a finished run (tracking=mlflow; else nothing); returns the MLflow run's id. A folder tracking URI (the
    default) uses MLflow's file store, which MLflow 3 keeps behind MLFLOW_ALLOW_FILE_STORE: set here for it."""
    if settings.tracking != "mlflow" or summary is None:
        return None
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError(MISSING) from None
    uri = tracking_uri(settings.tracking_uri)
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    method = str(summary.method.iloc[0])
    try:
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
        run = client.create_run(experiment_id, run_name=f"{method} on {settings.task.name} ({settings.model.name})")
        now = int(time.time() * 1000)
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in run_params(settings, method).items()],
                         metrics=[Metric(k, v, now, 0) for k, v in overall_metrics(summary).items()])
        for name in ("summary.csv", "meta.json"):
            client.log_artifact(run.info.run_id, str(Path(out_dir) / name))
        client.set_terminated(run.info.run_id)
    except MlflowException as err:
        raise ConfigError(f"tracking=mlflow at {uri}: {str(err).splitlines()[0]}") from None
    print(f"MLflow: run {run.info.run_id} in experiment {EXPERIMENT} at {uri}", file=sys.stderr)
    return run.info.run_id
