"""Medusa beside medusa-llm 0.1's medusa_generate (sides/upstream_driver.py) with its default tree
(`medusa_choices=[1, 7, 6]`: top-7 of head 1 x top-6 of head 2, 49 nodes), ours given the same nodes as a choices
list; our committed heads converted to its layout (bench/parity/upstream_heads.py)."""
from __future__ import annotations

from pathlib import Path

from bench.parity.environments import UPSTREAM_PACKAGES
from bench.parity.protocol import Comparison, Setup, counted_outputs, engine_outputs
from bench.parity.upstream_heads import medusa_heads

AGAINST = "medusa-llm 0.1"
MEDUSA_TREE = [1, 7, 6]  # medusa-llm 0.1's medusa_generate default


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    choices = [[i] for i in range(MEDUSA_TREE[1])] + [[i, j] for i in range(MEDUSA_TREE[1])
                                                       for j in range(MEDUSA_TREE[2])]
    folder = medusa_heads(setup.knobs("medusa")["checkpoint"], setup.model, work / "heads")
    run = {"method": "medusa", "heads_dir": str(folder), "medusa_choices": MEDUSA_TREE}
    [theirs] = UPSTREAM_PACKAGES.runs("upstream_driver", setup.side_job(), [run], work)
    ours = engine_outputs(setup, setup.drafter("medusa", choices=choices, tree_size=None))
    return [Comparison("medusa", f"medusa_choices={MEDUSA_TREE} ({len(choices)} nodes)", counted_outputs(setup, ours),
                       [(r["tokens"], r["steps"]) for r in theirs])]
