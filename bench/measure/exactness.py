"""Whether a method's greedy output is vanilla's, and where and why it is not."""
from __future__ import annotations

import math

import torch


@torch.inference_mode()
def find_divergence(model, turns: list[dict], baseline: dict, tie_margin: float) -> dict | None:
    """First position where greedy tokens differ from vanilla's, and whether the target's top-2 logits there are
    within `tie_margin` (a numerical tie that batched vs. single-token arithmetic may break either way)."""
    for index, (turn, base_ids) in enumerate(zip(turns, baseline["choices"][0]["token_ids"])):
        ids = turn["token_ids"]
        if ids == base_ids:
            continue
        position = next((i for i, (a, b) in enumerate(zip(ids, base_ids)) if a != b), min(len(ids), len(base_ids)))
        if position >= min(len(ids), len(base_ids)):  # one stopped earlier: stop rules differ, never a tie
            return {"turn": index, "position": position, "logit_gap": math.inf, "numeric_tie": False}
        prefix = torch.tensor([turn["prompt_ids"] + base_ids[:position]], device=model.device)
        logits = model(input_ids=prefix, logits_to_keep=1).logits[0, -1].float()
        ours, theirs = ids[position], base_ids[position]
        gap = (logits[theirs] - logits[ours]).item()
        top2 = logits.topk(2).indices.tolist()
        return {"turn": index, "position": position, "vanilla_token": theirs, "method_token": ours,
                "logit_gap": gap, "numeric_tie": ours in top2 and theirs in top2 and abs(gap) <= tie_margin}
    return None
