"""The report's answer before its tables: per setting, the fastest lossless method with its interval, #MAT and
tokens/s, and whether any method diverged from vanilla; and why one model's runs are in several tables."""
from __future__ import annotations

import pandas as pd

from bench.measure.metrics import speedup_text
from bench.report.runs import SETTING_COLUMNS
from bench.report.tables import VANILLA, is_flagged


def verdict(board: pd.DataFrame) -> str:
    """One setting's verdict: `fastest lossless pld 1.50x (1.41-1.60), #MAT 2.75, 14.0 → 21.0 tokens/s; no method
    diverged from vanilla`. Lossless: every answer equals vanilla's, numeric ties aside (exact_match_or_tie 1)."""
    overall = board[board.task == "overall"]
    drafted = overall[overall.method != VANILLA].sort_values("speedup", ascending=False, na_position="last",
                                                             kind="stable")
    if drafted.empty:
        rates = overall.tokens_per_s.dropna()
        return "vanilla only" + (f", {rates.iloc[0]:.1f} tokens/s" if len(rates) else "")
    if drafted.exact_match_or_tie.isna().all():
        return f"fastest {figures(drafted.iloc[0])}; answers not compared with vanilla's token by token (sampling)"
    lossless = drafted[drafted.exact_match_or_tie == 1]
    diverged = drafted[drafted.exact_match_or_tie < 1]
    head = f"fastest lossless {figures(lossless.iloc[0])}" if len(lossless) else "no method is lossless"
    if diverged.empty:
        return f"{head}; no method diverged from vanilla"
    return f"{head}; diverged from vanilla: " + ", ".join(
        f"{r.method} (on {len(r.diverged_questions.split(';'))} of {int(r.n_questions)} questions)"
        for r in diverged.itertuples())


def figures(row) -> str:
    """A method's overall numbers in a verdict: speedup (95% interval), #MAT, vanilla's and its tokens/s; ⚠ where
    it was timed while starved of CPU."""
    text = (f"{row.method} {speedup_text(row.speedup, row.speedup_ci_low, row.speedup_ci_high)}, "
            f"#MAT {row.mean_accepted_tokens:.2f}, {row.baseline_tokens_per_s:.1f} → {row.tokens_per_s:.1f} tokens/s")
    return text + (" ⚠ timed while starved of CPU" if is_flagged(row.starved) else "")


def split_note(board: pd.DataFrame, setting: str) -> str:
    """Where this setting's model has runs at other settings, what sets each apart: `Runs of m at another setting
    are in their own tables, never pooled with these: max_new_tokens 64; dtype float32.`; else ''."""
    settings = board.drop_duplicates("setting").set_index("setting")[SETTING_COLUMNS]
    mine = settings.loc[setting]
    others = settings[(settings.model == mine.model) & (settings.index != setting)]
    if others.empty:
        return ""
    differences = "; ".join(", ".join(f"{c} {v}" for c, v in row.items() if v != mine[c])
                            for _, row in others.iterrows())
    return f"Runs of {mine.model} at another setting are in their own tables, never pooled with these: {differences}."
