"""Token Recycling (Luo et al. 2024; Luowaterbi/TokenRecycling, Spec-Bench `model/recycling/`): training-free drafts
from the candidate tokens every verification forward computes anyway.

An adjacency matrix [vocab, k] keeps, for each token, the target's top-k next tokens the last time that token was an
input of a verification forward (root and every tree node, accepted or not). Each step fills a static tree template
breadth-first from it: a node at rank r under a parent holding token t gets matrix[t, r]. The matrix starts as zeros,
as upstream's (whose prefill logits are discarded), so the first step drafts token 0 everywhere.

Upstream keeps one matrix for the whole run (it is made once, next to the model); here it is per prompt by default
(`carry_over: false`): a turn's drafts then depend on its own tokens only, as batched rows and repeats need.
`carry_over: true` keeps it across the prompts one drafter decodes, as upstream does.
"""
from __future__ import annotations

import torch

from bench.engine.drafter import Drafter
from bench.engine.kvcache import host_to_device
from bench.engine.tree import DeviceTokens, DraftTree
from bench.knobs import check_knobs

# Static tree templates, as lists of choices: [0, 1] = the best next token of the root, then the second best after it.
TEMPLATES: dict[str, list[list[int]]] = {
    # Token Recycling's "2.2.2" (upstream tree_template_.py): 80 nodes over 6 levels, level by level.
    "2.2.2": [
        [0], [1], [2], [3], [4], [5], [6], [7],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0],
        [2, 1], [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0],
        [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0],
        [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1],
        [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0],
        [3, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
        [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
    ],
}


class TreeTemplate:
    """A template's shape: parents, each node's rank under its parent, and the node range of each level."""

    def __init__(self, choices: list[list[int]]):
        if [len(c) for c in choices] != sorted(len(c) for c in choices):
            raise ValueError("a tree template must list its nodes level by level")
        index = {tuple(c): i for i, c in enumerate(choices)}
        missing = [c for c in choices if len(c) > 1 and tuple(c[:-1]) not in index]
        if missing:
            raise ValueError(f"tree template nodes without their parent: {missing[:3]}")
        self.parents = [index[tuple(c[:-1])] if len(c) > 1 else -1 for c in choices]
        self.ranks = [c[-1] for c in choices]
        depths = [len(c) for c in choices]
        self.levels = [(depths.index(d), len(depths) - depths[::-1].index(d)) for d in sorted(set(depths))]
        self.shape = DraftTree([0] * len(choices), self.parents)  # masks and positions, built once

    def __len__(self) -> int:
        return len(self.parents)

    def fill(self, matrix: torch.Tensor, root: int, layout: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """[n] node tokens, on matrix's device: level by level, each node gets matrix[its parent's token, rank]."""
        parent_rows, ranks = layout  # parent_rows indexes [root, nodes...]
        tokens = torch.empty(1 + len(self), dtype=matrix.dtype, device=matrix.device)
        tokens[0] = root
        for begin, end in self.levels:
            tokens[1 + begin : 1 + end] = matrix[tokens[parent_rows[begin:end]], ranks[begin:end]]
        return tokens[1:]

    def layout(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (host_to_device([p + 1 for p in self.parents], device, torch.long),
                host_to_device(self.ranks, device, torch.long))


def template_choices(template: str | list) -> list[list[int]]:
    """A template's choices: TEMPLATES[name], or the list given."""
    return TEMPLATES[template] if isinstance(template, str) else [list(c) for c in template]


def template_problem(template: str | list, knobs: dict) -> str | None:
    """method.drafter.template's rule: a name in TEMPLATES, or choices that form a tree level by level."""
    if isinstance(template, str):
        return None if template in TEMPLATES else f"must be one of {', '.join(TEMPLATES)}, or a list of choices"
    if not template:
        return "must list at least one choice"
    try:
        TreeTemplate(template_choices(template))
    except (ValueError, TypeError) as err:
        return f"must list a tree's choices: {err}"
    return None


def k_problem(k: int, knobs: dict) -> str | None:
    """method.drafter.k's rule: the matrix keeps a successor for every rank the template drafts."""
    if template_problem(knobs["template"], knobs) is not None:
        return None  # the template's own line says what is wrong
    rank = max(c[-1] for c in template_choices(knobs["template"]))
    return None if k > rank else f"must exceed every rank of the template (max rank {rank})"


class AdjacencyMatrix:
    """[vocab, k] top-k successors per token on the target's device, plus one scratch row (index vocab) that absorbs
    the writes of a token's earlier duplicates within one refresh, so that its last occurrence wins."""

    def __init__(self, vocab: int, k: int, device: torch.device):
        self.vocab, self.k = vocab, k
        self.table = torch.zeros(vocab + 1, k, dtype=torch.long, device=device)

    @property
    def successors(self) -> torch.Tensor:
        return self.table[: self.vocab]

    def refresh(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Set each input token's row to the top-k of its logits ([L] tokens, [L, vocab] logits); no host sync."""
        top = logits[:, : self.vocab].topk(self.k, dim=-1).indices
        later_duplicate = (tokens[:, None] == tokens[None, :]).triu(diagonal=1).any(dim=1)
        rows = torch.where(later_duplicate, torch.full_like(tokens, self.vocab), tokens)
        self.table[rows] = top


class RecyclingDrafter(Drafter):
    """Token Recycling's drafter: the template filled from the adjacency matrix, under the root (see module doc)."""

    knob_rules = {"k": k_problem, "template": template_problem}

    def __init__(self, target=None, tokenizer=None, k: int = 8, template: str | list = "2.2.2",
                 carry_over: bool = False, vocab_size: int | None = None):
        check_knobs(type(self), k=k, template=template, carry_over=carry_over, vocab_size=vocab_size)
        self.k, self.carry_over = k, carry_over
        self.template = TreeTemplate(template_choices(template))
        self.vocab_size = vocab_size or target.get_output_embeddings().weight.shape[0]
        self.device = target.device if target is not None else torch.device("cpu")
        self.layout = self.template.layout(self.device)
        self.matrix: AdjacencyMatrix | None = None
        self.root: int | None = None

    def start(self, prompt_ids: list[int]) -> None:
        if self.matrix is None or not self.carry_over:
            self.matrix = AdjacencyMatrix(self.vocab_size, self.k, self.device)
        self.root = None  # the next root: known from propose's context or the previous step's bonus token

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self.root = context[-1]
        if max_tokens <= 1:
            return None
        return self.template.shape.with_tokens(DeviceTokens(self.template.fill(self.matrix.successors, self.root,
                                                                                self.layout)))

    def update(self, step) -> None:
        if self.root is not None:
            self.refresh(self.root, step.tree, step.logits)
        self.root = step.acceptance.tokens[-1]

    def refresh(self, root: int, tree: DraftTree | None, logits: torch.Tensor) -> None:
        """Learn from one verification forward: root and node rows of `logits` ([L, vocab], aux rows ignored)."""
        if tree is None or not len(tree):
            tokens = host_to_device([root], logits.device, torch.long)
        else:
            tokens = tree.input_ids(root, logits.device)[: 1 + len(tree)]
        self.matrix.refresh(tokens.to(self.matrix.table.device), logits[: len(tokens)].to(self.matrix.table.device))
