"""tracking=mlflow (bench/tracking.py): a finished run's settings, overall figures and files in MLflow, read back with
MLflow's own client; and the setting checked before a run (an unknown tracker, mlflow not installed)."""
from __future__ import annotations

import sys

import pandas as pd
import pytest

import bench.validate
from bench.config import compose_config
from bench.errors import ConfigError
from bench.measure.run import run
from bench.tracking import EXPERIMENT, MISSING, track_run
from bench.validate import validate


def test_a_tiny_run_logs_its_settings_figures_and_files_to_a_local_mlruns(compose, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason='mlflow is not installed (pip install -e ".[tracking]")')
    monkeypatch.chdir(tmp_path)  # tracking_uri null: ./mlruns
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # (so that the test's end restores its absence)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    summary = run(compose("method=pld", "task=qa", "task.limit=1", "tracking=mlflow"))
    client = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri())
    (logged,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    params, metrics = logged.data.params, logged.data.metrics
    assert {key: params[key] for key in ("method", "model", "task", "gen.max_new_tokens", "gen.temperature",
                                         "gen.batch_size", "method.drafter.num_pred_tokens")} == {
        "method": "pld", "model": "tiny", "task": "qa", "gen.max_new_tokens": "12", "gen.temperature": "0.0",
        "gen.batch_size": "1", "method.drafter.num_pred_tokens": "10"}
    overall = summary.set_index("task").loc["overall"]
    for key in ("speedup", "mean_accepted_tokens", "tokens_per_s", "baseline_tokens_per_s", "exact_match"):
        assert metrics[key] == pytest.approx(overall[key])
    assert metrics["n_questions"] == 1
    assert sorted(a.path for a in client.list_artifacts(logged.info.run_id)) == ["meta.json", "summary.csv"]
    assert logged.info.status == "FINISHED"


def test_no_tracking_imports_no_mlflow(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # any import of it fails
    settings = validate(compose_config("method=pld"))
    assert settings.tracking == "none" and settings.tracking_uri is None
    summary = pd.DataFrame({"method": ["pld"], "task": ["overall"], "speedup": [1.5]})
    assert track_run(settings, summary, tmp_path) is None


def test_the_tracker_is_checked_before_the_run(monkeypatch):
    with pytest.raises(ConfigError) as err:
        validate(compose_config("tracking=wandb"))
    assert str(err.value) == "tracking=wandb: must be none or mlflow (mlflow: log the finished run to MLflow)"
    monkeypatch.setattr(bench.validate, "mlflow_installed", lambda: False)
    with pytest.raises(ConfigError) as err:
        validate(compose_config("tracking=mlflow"))
    assert str(err.value) == MISSING == 'tracking=mlflow: mlflow is not installed; pip install -e ".[tracking]"'
