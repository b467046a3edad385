"""The token tree a drafter proposes for one verification step (a chain is a tree with one branch)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from bench.engine.kvcache import host_to_device

SHAPE_CACHE = ("depths", "children", "local_mask", "position_offsets", "is_chain", "device_layouts")


class DeviceTokens(Sequence):
    """Draft tokens still on the device ([n] int64), as a drafter that picks them there (Medusa) hands them over: the
    engine feeds `ids` to the verify forward as they are and brings them to the host with the step's one acceptance
    copy (`fill`). Reading them before that copies them to the host there and then (a host sync on CUDA)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids
        self._host: list[int] | None = None

    @property
    def on_host(self) -> bool:
        return self._host is not None

    def fill(self, tokens: list[int]) -> None:
        """The same tokens, already brought to the host."""
        self._host = tokens

    def _list(self) -> list[int]:
        if self._host is None:
            self._host = self.ids.tolist()
        return self._host

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, index):
        if isinstance(index, slice) and self._host is None:
            return DeviceTokens(self.ids[index])  # a cut tree (first_nodes) stays on the device
        return self._list()[index]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        return self._list() == (other._list() if isinstance(other, DeviceTokens) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"DeviceTokens({self._list() if self.on_host else self.ids})"


@dataclass
class DraftTree:
    """Candidate tokens hanging under the root, i.e. the last accepted token (not yet in the KV cache).

    `tokens[i]` is node i's token (a list, or DeviceTokens when the drafter made them on the device) and
    `parents[i]` its parent node (-1: the root); parents come before children.
    `draft_probs` ([n, vocab], optional) holds the distribution each node was drawn from, for speculative sampling;
    None means the proposal was deterministic. `siblings` says how the children of one node were drawn:
    "independent" (each from its own row of draft_probs) or "without_replacement" (in order, from their parent's
    q with the siblings drawn before them removed; every sibling's row holds that q before removals).
    Auxiliary nodes (`aux_*`, used by lookahead's Jacobi window) are scored in the same forward but are never
    accepted: they see the past, the root and the aux nodes marked in `aux_mask` ([m, m] bool), at positions
    root + `aux_depths` ([m]).
    """

    tokens: list[int] | DeviceTokens
    parents: list[int]
    draft_probs: torch.Tensor | None = None  # [n, vocab]
    siblings: str = "independent"  # or "without_replacement"
    aux_tokens: list[int] = field(default_factory=list)
    aux_depths: list[int] = field(default_factory=list)
    aux_mask: torch.Tensor | None = None  # [m, m] bool

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def with_tokens(self, tokens: list[int] | DeviceTokens, draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """A tree of the same shape with other tokens; its mask, positions and children (on the host and on the
        device) are built once on this tree and shared, so a method with a static tree (Medusa) builds them once,
        not every step."""
        tree = DraftTree(tokens if isinstance(tokens, DeviceTokens) else list(tokens), self.parents, draft_probs,
                         self.siblings)
        for name in SHAPE_CACHE:
            tree.__dict__[name] = getattr(self, name)
        return tree

    @property
    def tokens_on_device(self) -> bool:
        """True while the node tokens are DeviceTokens not yet brought to the host."""
        return isinstance(self.tokens, DeviceTokens) and not self.tokens.on_host

    def input_ids(self, root: int, device: torch.device) -> torch.Tensor:
        """[L] the step's input tokens (root, nodes, aux nodes) on `device`, without stalling the host."""
        if not self.tokens_on_device:
            return host_to_device([root, *self.tokens, *self.aux_tokens], device, torch.long)
        return torch.cat([host_to_device([root], device, torch.long), self.tokens.ids.long(),
                          host_to_device(self.aux_tokens, device, torch.long)])

    def on_device(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(local_mask, position_offsets) on `device`, copied there once per tree shape (see with_tokens)."""
        key = str(device)
        if key not in self.device_layouts:
            self.device_layouts[key] = (host_to_device(self.local_mask, device),
                                        host_to_device(self.position_offsets, device))
        return self.device_layouts[key]

    @cached_property
    def device_layouts(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {}

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


def first_nodes(tree: DraftTree, k: int) -> DraftTree:
    """The tree of the first k nodes (and every auxiliary node)."""
    if k >= len(tree):
        return tree
    probs = None if tree.draft_probs is None else tree.draft_probs[:k]
    return DraftTree(tree.tokens[:k], tree.parents[:k], probs, tree.siblings, tree.aux_tokens, tree.aux_depths,
                     tree.aux_mask)


def real_tree(tree: DraftTree | None) -> DraftTree | None:
    """A proposal as the engines verify it: None when it drafted nothing (no node and no auxiliary node)."""
    return tree if tree is not None and (len(tree) or tree.aux_tokens) else None
