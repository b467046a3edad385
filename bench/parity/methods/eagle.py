"""EAGLE-1 beside eagle-llm 1.2.1's eagenerate (sides/upstream_driver.py) with its static tree (its mc_sim_7b_63,
25 nodes: our `eagle_7b_25`); our committed head converted to SafeAILab's layout (bench/parity/upstream_heads.py)."""
from __future__ import annotations

from pathlib import Path

from bench.parity.environments import UPSTREAM_PACKAGES
from bench.parity.protocol import Comparison, Setup, counted_outputs, engine_outputs
from bench.parity.upstream_heads import eagle_head
from methods.heads.trees import TREES

AGAINST = "eagle-llm 1.2.1"
TREE = "eagle_7b_25"  # eagle-llm's mc_sim_7b_63


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    folder = eagle_head(setup.knobs("eagle")["checkpoint"], setup.model, work / "head")
    run = {"method": "eagle", "head_dir": str(folder), "tree_choices": TREES[TREE]}
    [theirs] = UPSTREAM_PACKAGES.runs("upstream_driver", setup.side_job(), [run], work)
    ours = engine_outputs(setup, setup.drafter("eagle", choices=TREE))
    return [Comparison("eagle", f"static tree mc_sim_7b_63 (= {TREE}, {len(TREES[TREE])} nodes)",
                       counted_outputs(setup, ours), [(r["tokens"], r["steps"]) for r in theirs])]
