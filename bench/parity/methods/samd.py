"""SAM-Decoding beside Spec-Bench's own runner (evaluation/inference_samd.py, model/samd; sides/spec_bench_driver.py)
with each fallback, as Spec-Bench's eval.sh sets SAMD (conf/method/samd.yaml's knobs, no static corpus). Upstream's
drafter keeps state across prompts (its recycling cache), so both sides decode Spec-Bench's sequence through one
drafter (its warm-up first, not counted). SAMD's generate decodes one token past max_new_tokens and its recycling
fallback learns from it: the samd[recycling] row does too (forwards counted until max_new_tokens). The EAGLE-2
fallback drafts SAM-Decoding's own tree (its Eagle2Model's defaults) over our committed EAGLE head."""
from __future__ import annotations

import json
from pathlib import Path

from bench.parity.environments import SPEC_BENCH, SPEC_BENCH_CHECKOUT, SPEC_BENCH_WARMUP
from bench.parity.protocol import Comparison, Setup, counted_outputs, knob_text, sequential_outputs
from bench.parity.upstream_heads import eagle_head
from methods.recycling import TEMPLATES

AGAINST = "Spec-Bench's inference_samd"


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    checkout = SPEC_BENCH_CHECKOUT.path(setup.checkouts)
    knobs = setup.knobs("samd")
    shared = {key: knobs[key] for key in ("n_predicts", "len_threshold", "len_bias")}
    tree = {key: setup.knobs("samd", upstream=True)["eagle2"][key] for key in ("total_token", "depth", "top_k")}
    eagle2 = {"checkpoint": knobs["eagle2"]["checkpoint"], **tree}
    folder = eagle_head(eagle2["checkpoint"], setup.model, work / "head")
    runs = [{"method": "samd", **shared, "tree_method": "token_recycle", "warmup": SPEC_BENCH_WARMUP},
            {"method": "samd", **shared, "tree_method": "eagle2", "head_dir": str(folder), "warmup": SPEC_BENCH_WARMUP}]
    recycling, eagle = SPEC_BENCH.runs("spec_bench_driver", {**setup.side_job(), "spec_bench": str(checkout)}, runs,
                                       work)
    ours_recycling = sequential_outputs(setup, setup.drafter("samd", fallback="recycling"), SPEC_BENCH_WARMUP,
                                        decode_past=1)
    ours_eagle = sequential_outputs(setup, setup.drafter("samd", fallback="eagle2", eagle2=eagle2), SPEC_BENCH_WARMUP)
    return [Comparison("samd[recycling]", f"{knob_text(shared)} fallback=recycling "
                       f"{knob_text(knobs['recycling'], 'recycling.')}{tree_note(checkout, knobs['recycling'])}, "
                       "1 token decoded past max_new_tokens as upstream's generate, vs Spec-Bench inference_samd "
                       "--tree_method token_recycle", counted_outputs(setup, ours_recycling),
                       [(r["tokens"], r["steps"]) for r in recycling]),
            Comparison("samd[eagle2]", f"{knob_text(shared)} fallback=eagle2 {knob_text(tree, 'eagle2.')} vs "
                       "Spec-Bench inference_samd --tree_method eagle2", counted_outputs(setup, ours_eagle),
                       [(r["tokens"], r["steps"]) for r in eagle])]


def recycle_tree_choices(tree_adj: dict[str, list[int]]) -> list[list[int]]:
    """SAM-Decoding's Token Recycling tree (model/samd/config/token_recycle.json: node -> its children in rank order,
    node 0 the root) as our template's choices, breadth-first (so level by level)."""
    choices, queue = [], [(0, [])]
    for node, path in queue:  # the queue grows while it is read
        for rank, child in enumerate(tree_adj[str(node)]):
            queue.append((child, path + [rank]))
            choices.append(path + [rank])
    return choices


def tree_note(spec_bench: Path, recycling: dict) -> str:
    """Nothing when our recycling fallback's template is upstream's tree (model/samd/config/token_recycle.json),
    else a note that it is not."""
    tree_adj = json.loads((spec_bench / "model" / "samd" / "config" / "token_recycle.json").read_text())["tree_adj"]
    template = recycling["template"]
    return "" if TEMPLATES.get(template, template) == recycle_tree_choices(tree_adj) else \
        f" (TEMPLATES[{template!r}] is not token_recycle.json's tree)"
