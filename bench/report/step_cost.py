"""The cross-engine record's `step_cost` view: one head in two engines, their speedups put on one footing.

Both engines accept the same drafts (docs/parity.md), so a head's speedup differs between them only by what a decode
step costs. Each engine's mean step: vanilla 1 / vanilla tokens/s, the head's #MAT / tokens/s. vLLM's vanilla step
is longer than ours by `extra` (the cost of a step in its server that is not the forward: scheduling, sampling,
streaming the step's tokens); a speedup amortises such a cost over the tokens a step accepts, so the same head gains
more in the engine that pays more per step. Adding vLLM's extra to every step of ours, vanilla's and the head's,
gives our speedup at vLLM's step cost, #MAT x (vanilla + extra) / (head + extra): where it meets vLLM's, the rest of
the gap was that cost, not the head or our drafter.
"""
from __future__ import annotations

import pandas as pd

from bench.same_head import HEADS, vllm_server

ENGINE_OF_DEVICE = {"server:vllm": "vllm"}  # the record's device column for vLLM's runs; ours is the run's device


def overall(board: pd.DataFrame) -> dict[str, pd.Series]:
    return {row.method: row for _, row in board[board.task == "overall"].iterrows()}


def step_cost_table(settings: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per head with runs in both engines at the same model and dtype: each engine's vanilla step, vLLM's
    extra per step, both speedups, ours at vLLM's step cost and the gaps (our speedup over vLLM's, minus 1: negative
    where ours is the lower)."""
    by_model: dict[str, dict[str, dict[str, pd.Series]]] = {}
    for board in settings:
        first = board.iloc[0]
        engine = ENGINE_OF_DEVICE.get(first.device, "ours")
        by_model.setdefault(f"{first['model']} ({first['dtype']})", {})[engine] = overall(board)
    rows = []
    for model, engines in by_model.items():
        ours, vllm = engines.get("ours", {}), engines.get("vllm", {})
        for head in HEADS:
            if head not in ours or vllm_server(head) not in vllm:
                continue
            mine, theirs = ours[head], vllm[vllm_server(head)]
            vanilla, head_step = 1 / mine.baseline_tokens_per_s, mine.mean_accepted_tokens / mine.tokens_per_s
            extra = 1 / theirs.baseline_tokens_per_s - vanilla
            at_their_cost = mine.mean_accepted_tokens * (vanilla + extra) / (head_step + extra)
            rows.append({"model": model, "head": head, "#MAT ours": mine.mean_accepted_tokens,
                         "#MAT vLLM": theirs.mean_accepted_tokens, "vanilla step ours (ms)": 1e3 * vanilla,
                         "vanilla step vLLM (ms)": 1e3 / theirs.baseline_tokens_per_s,
                         "vLLM's extra per step (ms)": 1e3 * extra, "speedup ours": mine.speedup,
                         "speedup vLLM": theirs.speedup, "gap": mine.speedup / theirs.speedup - 1,
                         "ours at vLLM's step cost": at_their_cost, "gap at vLLM's step cost":
                             at_their_cost / theirs.speedup - 1})
    return pd.DataFrame(rows)


def step_cost_text(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the docs show it: speedups as 0.00x, gaps as signed percentages, times to 0.1 ms."""
    shown = table.copy()
    for column in ("speedup ours", "speedup vLLM", "ours at vLLM's step cost"):
        shown[column] = shown[column].map(lambda x: f"{x:.2f}x")
    for column in ("gap", "gap at vLLM's step cost"):
        shown[column] = shown[column].map(lambda x: f"{round(100 * x) + 0:+d}%")  # + 0: no "-0%"
    for column in ("#MAT ours", "#MAT vLLM"):
        shown[column] = shown[column].map(lambda x: f"{x:.2f}")
    for column in [c for c in shown if c.endswith("(ms)")]:
        shown[column] = shown[column].map(lambda x: f"{x:.1f}")
    return shown
