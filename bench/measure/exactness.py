"""Whether a method's greedy output is vanilla's, and where and why it is not."""
from __future__ import annotations

import math

import torch


@torch.inference_mode()
def find_divergence(model, turns: list[dict], baseline: dict, tie_margin: float, check_model=None) -> dict | None:
    """First position where greedy tokens differ from vanilla's, and whether it is a numeric tie: both tokens' logits
    within `tie_margin` of the top logit, so batched vs. single-token arithmetic may pick either.

    `check_model` (default: `model`) judges the tie: a float32 copy of a bfloat16 target re-checks the two tokens at
    float32 precision, so bfloat16's own noise cannot excuse a divergence. `logit_gap` is the run's model's gap
    (vanilla's token minus the method's), `check_gap` the judging model's, `tie_distance` how far the farther of the
    two tokens lies below the judging model's top logit (the number compared with `tie_margin`)."""
    for index, (turn, base_ids) in enumerate(zip(turns, baseline["choices"][0]["token_ids"])):
        ids = turn["token_ids"]
        if ids == base_ids:
            continue
        position = next((i for i, (a, b) in enumerate(zip(ids, base_ids)) if a != b), min(len(ids), len(base_ids)))
        if position >= min(len(ids), len(base_ids)):  # one stopped earlier: stop rules differ, never a tie
            return {"turn": index, "position": position, "logit_gap": math.inf, "numeric_tie": False}
        prefix = turn["prompt_ids"] + base_ids[:position]
        ours, theirs = ids[position], base_ids[position]
        logits = _last_logits(model, prefix)
        found = {"turn": index, "position": position, "vanilla_token": theirs, "method_token": ours,
                 "logit_gap": (logits[theirs] - logits[ours]).item()}
        if check_model is not None and check_model is not model:
            logits = _last_logits(check_model, prefix)
            found["check_dtype"] = str(next(check_model.parameters()).dtype).removeprefix("torch.")
            found["check_gap"] = (logits[theirs] - logits[ours]).item()
        found["tie_distance"] = (logits.max() - logits[[ours, theirs]].min()).item()  # the farther token's
        found["numeric_tie"] = found["tie_distance"] <= tie_margin
        return found
    return None


def _last_logits(model, prefix: list[int]) -> torch.Tensor:
    """The model's float logits for the token after `prefix` (one uncached forward)."""
    ids = torch.tensor([prefix], device=model.device)
    return model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()

