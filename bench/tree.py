"""The token tree a drafter proposes for one verification step (a chain is a tree with one branch)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass
class DraftTree:
    """Candidate tokens hanging under the root, i.e. the last accepted token (not yet in the KV cache).

    `tokens[i]` is node i's token and `parents[i]` its parent node (-1: the root); parents come before children.
    `draft_probs` ([n, vocab], optional) holds the distribution each node was drawn from, for speculative sampling;
    None means the proposal was deterministic. `siblings` says how the children of one node were drawn:
    "independent" (each from its own row of draft_probs) or "without_replacement" (in order, from their parent's
    q with the siblings drawn before them removed; every sibling's row holds that q before removals).
    Auxiliary nodes (`aux_*`, used by lookahead's Jacobi window) are scored in the same forward but are never
    accepted: they see the past, the root and the aux nodes marked in `aux_mask` ([m, m] bool), at positions
    root + `aux_depths` ([m]).
    """

    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None = None  # [n, vocab]
    siblings: str = "independent"  # or "without_replacement"
    aux_tokens: list[int] = field(default_factory=list)
    aux_depths: list[int] = field(default_factory=list)
    aux_mask: torch.Tensor | None = None  # [m, m] bool

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def with_tokens(self, tokens: list[int], draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """A tree of the same shape with other tokens; its cached mask, positions and children are reused, so a
        method with a static tree (Medusa) builds them once, not every step."""
        tree = DraftTree(list(tokens), self.parents, draft_probs, self.siblings)
        for name in ("depths", "children", "local_mask", "position_offsets", "is_chain"):
            if name in self.__dict__:
                tree.__dict__[name] = self.__dict__[name]
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def is_chain(self) -> bool:
        return not self.aux_tokens and self.parents == list(range(-1, len(self.parents) - 1))

    @cached_property
    def depths(self) -> list[int]:
        """Depth of each node; the root's children have depth 1."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    @cached_property
    def children(self) -> list[list[int]]:
        """children[0] lists the root's children, children[i + 1] node i's, as node indices."""
        children: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for node, parent in enumerate(self.parents):
            children[parent + 1].append(node)
        return children

    @cached_property
    def local_mask(self) -> torch.Tensor:
        """[L, L] bool attention among the L = 1 + n + m inputs of the step (root, nodes, aux nodes)."""
        n, m = len(self.tokens), len(self.aux_tokens)
        mask = torch.zeros(1 + n + m, 1 + n + m, dtype=torch.bool)
        mask[:, 0] = True
        for node, parent in enumerate(self.parents):
            row = node + 1
            if parent >= 0:
                mask[row, : 1 + n] = mask[parent + 1, : 1 + n]
            mask[row, row] = True
        if m:
            mask[1 + n :, 1 + n :] = self.aux_mask
        return mask

    @cached_property
    def position_offsets(self) -> torch.Tensor:
        """[L] position of each input relative to the root."""
        return torch.tensor([0, *self.depths, *self.aux_depths], dtype=torch.long)
