"""Whether a method's greedy output is its baseline's, and where and why it is not."""
from __future__ import annotations

import math

import torch

NO_LOGITS = "a server returns no logits here, so whether this is a numeric tie cannot be told"
STOPPED_EARLIER = "one side stopped earlier: stop rules differ, never a tie"


@torch.inference_mode()
def find_divergence(model, turns: list[dict], baseline: dict, tie_margin: float = 0.0,
                    check_model=None) -> dict | None:
    """First position where the method's greedy tokens differ from the baseline record's (None: all equal), and
    whether it is a numeric tie: both tokens' logits within `tie_margin` of the top logit, so batched vs.
    single-token arithmetic may pick either.

    `check_model` (default: `model`) judges the tie: a float32 copy of a bfloat16 target re-checks the two tokens at
    float32 precision, so bfloat16's own noise cannot excuse a divergence. `logit_gap` is the run's model's gap (the
    baseline's token minus the method's), `check_gap` the judging model's, `tie_distance` how far the farther of the
    two tokens lies below the judging model's top logit (the number compared with `tie_margin`). Without a `model`
    (a server returns no logits) no tie can be proven: numeric_tie is false and logit_gap null, with the reason."""
    for index, (turn, baseline_ids) in enumerate(zip(turns, baseline["choices"][0]["token_ids"])):
        ids = turn["token_ids"]
        if ids == baseline_ids:
            continue
        shorter = min(len(ids), len(baseline_ids))
        position = next((i for i, (a, b) in enumerate(zip(ids, baseline_ids)) if a != b), shorter)
        found = {"turn": index, "position": position}
        if position >= shorter and model is None:
            return {**found, "logit_gap": None, "numeric_tie": False, "reason": STOPPED_EARLIER}
        if position >= shorter:  # one stopped earlier: stop rules differ, never a tie
            return {**found, "logit_gap": math.inf, "numeric_tie": False}
        found.update(vanilla_token=baseline_ids[position], method_token=ids[position])
        if model is None:
            return {**found, "logit_gap": None, "numeric_tie": False, "reason": NO_LOGITS}
        return {**found, **judge_tie(model, turn["prompt_ids"] + baseline_ids[:position], ids[position],
                                     baseline_ids[position], tie_margin, check_model)}
    return None


def judge_tie(model, prefix: list[int], ours: int, theirs: int, tie_margin: float, check_model=None) -> dict:
    """logit_gap, tie_distance and numeric_tie (and check_dtype, check_gap with a `check_model`) of the method's
    token `ours` against the baseline's `theirs` after `prefix` (find_divergence's fields)."""
    logits = _last_logits(model, prefix)
    judged = {"logit_gap": (logits[theirs] - logits[ours]).item()}
    if check_model is not None and check_model is not model:
        logits = _last_logits(check_model, prefix)
        judged["check_dtype"] = str(next(check_model.parameters()).dtype).removeprefix("torch.")
        judged["check_gap"] = (logits[theirs] - logits[ours]).item()
    judged["tie_distance"] = (logits.max() - logits[[ours, theirs]].min()).item()  # the farther token's
    judged["numeric_tie"] = judged["tie_distance"] <= tie_margin
    return judged


def _last_logits(model, prefix: list[int]) -> torch.Tensor:
    """The model's float logits for the token after `prefix` (one uncached forward)."""
    ids = torch.tensor([prefix], device=model.device)
    return model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()

