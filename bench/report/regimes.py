"""The report's views of the regimes beside the greedy short-prompt leaderboard: speedup and #MAT per input-length
bucket (the long-input task, conf/task/long_inputs.yaml), against the sampling temperature (runs at several
gen.temperature values and seeds), and of one model's weights in float32 beside bfloat16."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from bench.measure.metrics import mean_accepted_tokens, speedup_interval, speedup_text, tokens_per_second
from bench.report.runs import SETTING_COLUMNS, method_labels, select_latest
from bench.report.tables import VANILLA

BUCKET_TASK = re.compile(r"long_(\d+)k")  # the long-input task's categories: long_1k, long_2k, long_4k, long_7k
BUCKET_NUMBERS = ("speedup", "low", "high", "#MAT")  # bucket_table's columns per bucket: `<bucket> <number>`


def bucket_tasks(tasks) -> list[str]:
    """The input-length buckets among `tasks`, shortest first (long_2k before long_16k)."""
    return sorted({t for t in tasks if BUCKET_TASK.fullmatch(t)}, key=lambda t: int(BUCKET_TASK.fullmatch(t)[1]))


def regime_columns(table: pd.DataFrame) -> list[str]:
    """What a regime table (bucket_table, dtype_table) has a column group for, in its order: each `<x> speedup`'s x."""
    return [c.removesuffix(" speedup") for c in table.columns if c.endswith(" speedup")]


def bucket_table(board: pd.DataFrame) -> pd.DataFrame:
    """One setting's long-input view: a row per drafting method, per bucket (in length order) its speedup, the
    speedup's 95% interval and #MAT (BUCKET_NUMBERS); no bucket columns where the board has no bucket."""
    buckets = bucket_tasks(board.task)
    drafted = board[(board.method != VANILLA) & board.task.isin(buckets)]
    rows = []
    for method, group in drafted.groupby("method", sort=False):
        by_task = group.set_index("task")
        row = {"Method": method}
        for bucket in buckets:
            hit = by_task.loc[bucket] if bucket in by_task.index else None
            values = (math.nan,) * 4 if hit is None else (hit.speedup, hit.speedup_ci_low, hit.speedup_ci_high,
                                                          hit.mean_accepted_tokens)
            row.update(zip((f"{bucket} {number}" for number in BUCKET_NUMBERS), values))
        rows.append(row)
    return pd.DataFrame(rows, columns=["Method", *(f"{b} {number}" for b in buckets for number in BUCKET_NUMBERS)])


def bucket_text(table: pd.DataFrame) -> pd.DataFrame:
    """bucket_table as displayed: a column per bucket, `1.35x (1.21-1.49) · 2.10` (speedup, its interval, #MAT)."""
    buckets = regime_columns(table)
    shown = pd.DataFrame({"Method": table.Method})
    for bucket in buckets:
        shown[bucket] = [speedup_text(s, lo, hi) + ("" if pd.isna(mat) else f" · {mat:.2f}") for s, lo, hi, mat in
                         zip(*(table[f"{bucket} {number}"] for number in BUCKET_NUMBERS))]
    return shown


def temperature_sweeps(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """The runs of each group of settings that differ only in gen.temperature, where a group has two or more
    temperatures: the latest run per setting, method variant, task and seed (seeds are kept apart)."""
    latest = select_latest(runs, apart=("seed",))
    if latest.empty:
        return []
    others = [c for c in SETTING_COLUMNS if c != "temperature"]
    groups = latest.groupby(others, sort=False, dropna=False)
    return [group for _, group in groups if group.temperature.nunique() > 1]


def temperature_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """A row per method x temperature of one sweep (temperature_sweeps): questions, seeds, speedup over vanilla and
    #MAT with their 95% intervals, each a paired bootstrap over the (question, seed) pairs, all tasks together."""
    sweep = sweep.assign(method_config=sweep.method_config.map(without_run_seed))
    labels = method_labels(sweep)
    vanilla = {(r.setting, r.seed, r.question_id): r.record for r in sweep[sweep.is_baseline].itertuples()}
    pairs: dict[tuple[str, float], list[tuple[dict, dict | None]]] = {}
    seeds: dict[tuple[str, float], set] = {}
    for r in sweep[~sweep.is_baseline].itertuples():
        key = (labels[r.setting, r.method_config], float(r.temperature))
        baseline = r.baseline if r.baseline is not None else vanilla.get((r.setting, r.seed, r.question_id))
        pairs.setdefault(key, []).append((r.record, baseline))
        seeds.setdefault(key, set()).add(r.seed)
    rows = [{"method": method, "temperature": temperature, **sampled_numbers(chosen),
             "seeds": len(seeds[method, temperature])} for (method, temperature), chosen in pairs.items()]
    columns = ["method", "temperature", "n_pairs", "seeds", "speedup", "speedup_ci_low", "speedup_ci_high",
               "mean_accepted_tokens", "mat_ci_low", "mat_ci_high"]
    return pd.DataFrame(rows, columns=columns).sort_values(["method", "temperature"], kind="stable",
                                                          ignore_index=True)


def without_run_seed(method_config: str) -> str:
    """A method config (JSON) without its drafter's `seed`: a drafter that samples its own drafts takes the run's
    seed (conf/method/*.yaml `seed: ${seed}`), which the temperature view pools over rather than telling apart."""
    config = json.loads(method_config)
    if isinstance(config.get("drafter"), dict):
        config["drafter"] = {k: v for k, v in config["drafter"].items() if k != "seed"}
    return json.dumps(config, sort_keys=True, default=str)


def sampled_numbers(pairs: list[tuple[dict, dict | None]]) -> dict:
    """Speedup and #MAT of (record, baseline record) pairs, each with the 95% interval of a bootstrap over the
    pairs: speedup = mean tokens/s / mean baseline tokens/s over the pairs with a baseline; #MAT = decoded tokens /
    decode steps, a ratio of means too (mean_accepted_tokens)."""
    paired = [(tokens_per_second(r), tokens_per_second(b)) for r, b in pairs if b is not None]
    speeds = np.array(paired, dtype=float).reshape(-1, 2)  # [pairs with a baseline, 2]
    choices = [r["choices"][0] for r, _ in pairs]
    decoded = np.array([sum(n - 1 for n in c["new_tokens"] if n) for c in choices], dtype=float)  # [pairs]
    steps = np.array([sum(s or 0 for s in c["decoding_steps"]) for c in choices], dtype=float)  # [pairs]
    speedup = speeds[:, 0].mean() / speeds[:, 1].mean() if len(speeds) else math.nan
    mat = mean_accepted_tokens([r for r, _ in pairs])
    mat_interval = speedup_interval(decoded, steps) if not math.isnan(mat) else (math.nan, math.nan)
    return {"n_pairs": len(pairs), "speedup": speedup, **dict(zip(("speedup_ci_low", "speedup_ci_high"),
                                                                  speedup_interval(speeds[:, 0], speeds[:, 1]))),
            "mean_accepted_tokens": mat, "mat_ci_low": mat_interval[0], "mat_ci_high": mat_interval[1]}


def temperature_text(table: pd.DataFrame) -> pd.DataFrame:
    """temperature_table as displayed: a row per method, a column per temperature, `1.35x (1.21-1.49) · 2.10
    (2.02-2.19)` (speedup and #MAT, each with its interval); the (question, seed) pairs per column in its heading."""
    temperatures = sorted(table.temperature.unique())
    shown = []
    for method, group in table.groupby("method", sort=False):
        by_t = group.set_index("temperature")
        row = {"Method": method}
        for t in temperatures:
            if t not in by_t.index:
                row[f"T={t:g}"] = "—"
                continue
            r = by_t.loc[t]
            mat = "—" if pd.isna(r.mean_accepted_tokens) else f"{r.mean_accepted_tokens:.2f}" + (
                "" if pd.isna(r.mat_ci_low) else f" ({r.mat_ci_low:.2f}-{r.mat_ci_high:.2f})")
            row[f"T={t:g}"] = f"{speedup_text(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} · {mat}"
        shown.append(row)
    return pd.DataFrame(shown)


DTYPE_ORDER = ("float32", "float16", "bfloat16")  # the dtype view's columns: full precision first
DTYPE_NUMBERS = ("speedup", "low", "high", "#MAT", "exact")  # dtype_table's columns per dtype: `<dtype> <number>`


def dtype_groups(board: pd.DataFrame, runs: pd.DataFrame) -> list[pd.DataFrame]:
    """The overall rows of each group of settings that run the same weights (runs' `weights`) on one machine with
    the same max_new_tokens, temperature and batch size in two or more dtypes (smollm2_135m beside
    smollm2_135m_bf16); each row gains its `weights`."""
    weights = runs.drop_duplicates("setting").set_index("setting").weights
    overall = board[board.task == "overall"].assign(weights=lambda b: b.setting.map(weights))
    shared = ["weights", "device", "device_name", "max_new_tokens", "temperature", "batch_size"]
    return [group for _, group in overall.groupby(shared, sort=False, dropna=False) if group.dtype.nunique() > 1]


def dtypes_of(group: pd.DataFrame) -> list[str]:
    """A group's dtypes, full precision first (DTYPE_ORDER, then any other alphabetically)."""
    return sorted(set(group.dtype), key=lambda d: (DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER), d))


def dtype_table(group: pd.DataFrame) -> pd.DataFrame:
    """One dtype group's view (dtype_groups): a row per method (vanilla's row: its tokens/s as `speedup`), per dtype
    its overall speedup, the speedup's 95% interval, #MAT and exact_match_or_tie (DTYPE_NUMBERS); ordered by the
    speedup in the last dtype (the GPU-like regime), best first."""
    dtypes = dtypes_of(group)
    vanilla = {"Method": VANILLA}
    for dtype in dtypes:  # vanilla's own speed per dtype, from the baselines decoded beside the methods
        speeds = group[group.dtype == dtype].baseline_tokens_per_s.dropna()
        vanilla[f"{dtype} speedup"] = float(speeds.median()) if len(speeds) else math.nan
    rows = []
    for method, rows_of_method in group[group.method != VANILLA].groupby("method", sort=False):
        by_dtype = rows_of_method.set_index("dtype")
        row = {"Method": method}
        for dtype in dtypes:
            hit = by_dtype.loc[dtype] if dtype in by_dtype.index else None
            values = (math.nan,) * 5 if hit is None else (hit.speedup, hit.speedup_ci_low, hit.speedup_ci_high,
                                                          hit.mean_accepted_tokens, hit.exact_match_or_tie)
            row.update(zip((f"{dtype} {number}" for number in DTYPE_NUMBERS), values))
        rows.append(row)
    columns = ["Method", *(f"{d} {number}" for d in dtypes for number in DTYPE_NUMBERS)]
    drafted = pd.DataFrame(rows, columns=columns).sort_values(f"{dtypes[-1]} speedup", ascending=False,
                                                              na_position="last", kind="stable")
    return pd.concat([pd.DataFrame([vanilla], columns=columns), drafted], ignore_index=True)


def dtype_text(table: pd.DataFrame) -> pd.DataFrame:
    """dtype_table as displayed: a column per dtype, `1.35x (1.21-1.49) · 2.10` (speedup, its interval, #MAT), `≠`
    and the exact share where some answer left vanilla's other than at a numeric tie; vanilla's row: tokens/s."""
    dtypes = regime_columns(table)
    shown = pd.DataFrame({"Method": table.Method})
    for dtype in dtypes:
        cells = []
        for method, speedup, low, high, mat, exact in zip(table.Method, *(table[f"{dtype} {n}"]
                                                                          for n in DTYPE_NUMBERS)):
            if method == VANILLA:
                cells.append("—" if pd.isna(speedup) else f"{speedup:.1f} tok/s")
                continue
            cell = speedup_text(speedup, low, high) + ("" if pd.isna(mat) else f" · {mat:.2f}")
            cells.append(cell + ("" if pd.isna(exact) or exact == 1 else f" ≠ ({exact:.2f} exact)"))
        shown[dtype] = cells
    return shown
