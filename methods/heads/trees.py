"""Named draft trees, as lists of choices: a node is the path of top-k ranks from the root ([0, 1] = the best token
at depth 1, then the second best under it). Parents must be listed too; every prefix of these lists is a tree.
Configs name them (`choices: mc_sim_7b_63`) or give a list."""
from __future__ import annotations

import torch

from bench.engine.tree import DraftTree

TREES: dict[str, list[list[int]]] = {
    # Medusa's default for 7B models (63 nodes, depth 4, top-10 per head), as Spec-Bench runs Medusa and Hydra.
    "mc_sim_7b_63": [
        [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
        [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9],
        [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
        [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0],
        [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0],
        [0, 0, 0, 1], [1, 6], [0, 7, 0]
    ],
    # EAGLE's own 25-node, depth-5 tree for 7B models (also named mc_sim_7b_63 in EAGLE's and Spec-Bench's code).
    "eagle_7b_25": [
        [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0], [0, 0, 1],
        [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]
    ],
}


def choices_rule(value, knobs: dict) -> str | None:
    """bench.knobs rule of a `choices` knob: a tree named in TREES, or choices whose every path has its parent."""
    try:
        resolved = resolve_choices(value)
        if resolved is not None:
            tree_from_choices(resolved)
    except ValueError as err:
        return f"must be a tree named in methods/heads/trees.py or a list of choices ({err})"
    return None


def resolve_choices(choices: str | list | None) -> list[list[int]] | None:
    """A tree's choices from its name in TREES, or as given."""
    if isinstance(choices, str):
        if choices not in TREES:
            raise ValueError(f"unknown tree '{choices}'; name one of {sorted(TREES)} or give a list of choices")
        return TREES[choices]
    return None if choices is None else [list(c) for c in choices]


def tree_from_choices(choices: list[list[int]]) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """A static tree from Medusa choices: (template tree with placeholder tokens, head of each node [n], top-k rank
    of each node [n]). Node order: by depth, then lexicographic, so parents come before children."""
    paths = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))
    index = {path: i for i, path in enumerate(paths)}
    parents = []
    for path in paths:
        if len(path) > 1 and path[:-1] not in index:
            raise ValueError(f"Medusa choice {list(path)} has no parent {list(path[:-1])} in the choices list")
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
    template = DraftTree([0] * len(paths), parents)
    heads = torch.tensor([len(p) - 1 for p in paths])
    ranks = torch.tensor([p[-1] for p in paths])
    return template, heads, ranks


def static_tree(choices, tree_size: int | None, num_heads: int, method: str):
    """tree_from_choices of the first `tree_size` choices (a name in methods/heads/trees.py or a list; default: one
    chain as deep as the heads), refused when deeper than the checkpoint's `num_heads`."""
    choices = (resolve_choices(choices) or [[0] * d for d in range(1, num_heads + 1)])[:tree_size]
    template, node_heads, node_ranks = tree_from_choices(choices)
    if int(node_heads.max()) >= num_heads:
        raise ValueError(f"the {method} tree is {int(node_heads.max()) + 1} deep but the checkpoint has {num_heads} "
                         f"heads; use a shallower method.drafter.choices")
    return template, node_heads, node_ranks
