"""Token Recycling (Luo et al. 2024; Luowaterbi/TokenRecycling, Spec-Bench `model/recycling/`): training-free drafts
from the candidate tokens every verification forward computes anyway.

An adjacency matrix [vocab, k] keeps, for each token, the target's top-k next tokens the last time that token was an
input of a verification forward (root and every tree node, accepted or not). Each step fills a static tree template
breadth-first from it: a node at rank r under a parent holding token t gets matrix[t, r]. The matrix starts as zeros,
so a token never seen drafts token 0 under it.

As upstream, the matrix lives for the whole run by default (`carry_over: true`): upstream makes it once, next to the
model, so Spec-Bench's three warm-up generations fill it first and every question learns from all earlier ones (a
row's drafts then depend on question order). `carry_over: false` starts each turn from zeros, so that a turn's drafts
depend on its own tokens only (order-independent rows). A carried matrix is made with the drafter and shared by
every copy of it: the rows of a batch (bench/engine/batched.py's fork_drafter) read and refresh one matrix, as
upstream's single global one, in row order within a step, so a batched run is deterministic given its prompts' order
(but its rows' drafts differ from batch-1 decoding's). `learned_state` / `restore_learned_state` copy the carried
matrix out and back, so that the harness starts every repeat of a turn from the same matrix.

Upstream Token Recycling discards the prefill's logits (Spec-Bench `evaluation/inference_recycling.py`: the prompt's
forward updates nothing); SAM-Decoding's Token Recycling fallback refreshes the matrix from every prompt row
(`seed_from_prefill: true`: the prefill's features through the target's LM head, so the engine hands this drafter the
target's last hidden states). Not reproduced: upstream skips the refresh of a turn's last step (it stops before it).
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
    # SAM-Decoding's Token Recycling fallback (hyx1999/SAM-Decoding samd/config/token_recycle.json, the same file in
    # Spec-Bench model/samd/config/): 60 nodes over 5 levels.
    "samd": [
        [0], [1], [2], [3], [4], [5], [6],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [1, 0], [1, 1], [1, 2], [1, 3], [1, 4], [2, 0], [2, 1],
        [2, 2], [3, 0], [3, 1], [4, 0], [4, 1], [5, 0], [6, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0],
        [1, 0, 0], [1, 0, 1], [1, 0, 2], [1, 1, 0], [1, 1, 1], [1, 2, 0], [1, 3, 0], [2, 0, 0], [2, 1, 0],
        [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 1], [1, 1, 0, 0],
        [2, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0],
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


PREFILL_CHUNK = 512  # prompt rows put through the LM head at once by seed_from_prefill


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
                 carry_over: bool = True, seed_from_prefill: bool = False, vocab_size: int | None = None):
        check_knobs(type(self), k=k, template=template, carry_over=carry_over, seed_from_prefill=seed_from_prefill,
                    vocab_size=vocab_size)
        self.k, self.carry_over, self.seed_from_prefill = k, carry_over, seed_from_prefill
        self.template = TreeTemplate(template_choices(template))
        self.vocab_size = vocab_size or target.get_output_embeddings().weight.shape[0]
        self.device = target.device if target is not None else torch.device("cpu")
        self.layout = self.template.layout(self.device)
        if seed_from_prefill:  # the prompt's last hidden states, through the target's LM head at start()
            self.feature_layers, self.lm_head = (-1,), target.get_output_embeddings()
        # carried: one matrix from the start, shared by every copy (batched rows, SamdDrafter's per-turn copies)
        self.matrix = AdjacencyMatrix(self.vocab_size, self.k, self.device) if carry_over else None
        self.root: int | None = None

    @property
    def learns_across_prompts(self) -> bool:
        """True when one prompt's drafts depend on the prompts decoded before it (the carried matrix)."""
        return self.carry_over

    def learned_state(self) -> torch.Tensor | None:
        """A copy of the carried matrix (None without carry_over), for restore_learned_state."""
        return self.matrix.table.clone() if self.carry_over else None

    def restore_learned_state(self, state: torch.Tensor | None) -> None:
        """Put back what learned_state() returned, in place: every copy sharing the matrix sees it."""
        if state is not None:
            self.matrix.table.copy_(state)

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        """A new turn; `hidden` ([P, H], the prompt's last hidden states) is given when seed_from_prefill."""
        if not self.carry_over:
            self.matrix = AdjacencyMatrix(self.vocab_size, self.k, self.device)
        if hidden is not None:
            self.seed(prompt_ids, hidden)
        self.root = None  # the next root: known from propose's context or the previous step's bonus token

    def seed(self, prompt_ids: list[int], hidden: torch.Tensor) -> None:
        """Refresh the prompt tokens' rows from the prefill's logits (the prompt's features through the LM head, a
        chunk of rows at a time), as SAM-Decoding's fallback does with its prefill logits."""
        tokens = host_to_device(prompt_ids, self.matrix.table.device, torch.long)
        for begin in range(0, len(prompt_ids), PREFILL_CHUNK):
            logits = self.lm_head(hidden[begin : begin + PREFILL_CHUNK])
            self.matrix.refresh(tokens[begin : begin + PREFILL_CHUNK], logits.to(self.matrix.table.device))

    def most_nodes(self) -> int:
        return len(self.template)

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self.root = context[-1]
        if max_tokens <= 1:
            return None
        return self.template.shape.with_tokens(DeviceTokens(self.template.fill(self.matrix.successors, self.root,
                                                                                self.layout)))

    def follow(self, root: int) -> None:
        """The root of the step about to be verified, whose draft another drafter made (SAM-Decoding's chains), so
        that the step's logits still refresh the matrix."""
        self.root = root

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
