"""EAGLE-1's drafter (`method=eagle`): EAGLE's head drafting a static tree given as a choices list.

The tree is a choices list like Medusa's (a node is a path of top-k ranks), expanded level by level, one head forward
per level. Under greedy decoding a node's children are the head's top-k; under sampling they are drawn from the
draft's q without replacement and the tree says so, so that the engine's rule removes a rejected token from q before
the next sibling. Lossless either way.
"""
from __future__ import annotations

from collections import Counter

import torch

from bench.engine.sampling import SamplingConfig, logits_to_probs
from bench.engine.tree import DraftTree
from bench.knobs import check_knobs
from methods.eagle.drafter import EagleDrafter
from methods.eagle.head import EagleHead
from methods.heads.common import DraftVocabulary
from methods.heads.tiny import random_weights
from methods.heads.trees import choices_rule, resolve_choices


class Eagle1Drafter(EagleDrafter):
    """EAGLE-1's static tree (`choices`: a tree named in methods/heads/trees.py, or a list) over an EAGLE head."""

    knob_rules = {"choices": choices_rule}

    def __init__(self, target, tokenizer=None, checkpoint: str | None = "",
                 choices: str | list[list[int]] = "eagle_7b_25", sampling: SamplingConfig | None = None,
                 seed: int | None = None, head: EagleHead | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(Eagle1Drafter, choices=choices)
        super().__init__(target, checkpoint, sampling, seed, head, vocab)
        paths = sorted({tuple(c) for c in resolve_choices(choices)}, key=lambda c: (len(c), c))
        self.static_children: dict[tuple, int] = {}  # children per node, by path
        for path in paths:
            self.static_children[path[:-1]] = max(self.static_children.get(path[:-1], 0), path[-1] + 1)
        self.depth = max(len(p) for p in paths)
        self.static_paths = set(paths)

    def most_nodes(self) -> int:
        return len(self.static_paths)

    def fed_rows(self) -> int:
        """The widest level of the tree, or a step's accepted rows: the root and a path of `depth` nodes."""
        return max(max(Counter(len(path) for path in self.static_paths).values()), self.depth + 1)

    def draft_tree(self, root_feature: torch.Tensor) -> DraftTree | None:
        """EAGLE-1's tree: the `choices` paths, level by level (one head forward per level but the last). Under
        sampling a node's children are drawn from q without replacement and the tree says so (EAGLE's own rule)."""
        n = self.context_len
        self._outputs = {-1: root_feature}  # node -> the head's predicted feature after it
        tokens: list[int] = []
        parents: list[int] = []
        paths: list[tuple] = []
        probs: list[torch.Tensor] = []
        frontier = [-1]  # nodes whose children come next (-1: the root)
        frontier_features = root_feature[None]  # [f, H]
        for level in range(1, self.depth + 1):
            count = max(self.static_children.get(paths[node] if node >= 0 else (), 0) for node in frontier)
            if count == 0:
                break
            positions, q = self._children(self.vocab(frontier_features), min(count, self.vocab.size))
            count = positions.shape[1]  # [f, count]: fewer where q has fewer nonzero tokens
            new_nodes = [(r, k) for r, node in enumerate(frontier) for k in range(count)
                         if (paths[node] if node >= 0 else ()) + (k,) in self.static_paths]
            if not new_nodes:
                break
            rows = torch.tensor([r for r, _ in new_nodes], device=self.device)
            ranks = torch.tensor([k for _, k in new_nodes], device=self.device)
            node_tokens = self.vocab.to_token_ids(positions[rows, ranks]).tolist()
            first = len(tokens)
            for (r, k), token in zip(new_nodes, node_tokens):
                parent = frontier[r]
                tokens.append(token)
                parents.append(parent)
                paths.append((paths[parent] if parent >= 0 else ()) + (k,))
                if q is not None:
                    probs.append(q[r])
            if level == self.depth:
                break
            frontier = list(range(first, len(tokens)))
            frontier_features = self._tree_forward(tokens, parents, frontier, n)
        if not tokens:
            return None
        return DraftTree(tokens, parents, torch.stack(probs) if probs else None,
                         "without_replacement" if probs else "independent")

    def _children(self, logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(slice positions [rows, count], q over the full vocabulary [rows, vocab] or None) of each row's children:
        top-count under greedy, drawn without replacement under sampling."""
        if self.sampling.greedy:
            return logits.topk(count, dim=-1).indices, None
        q = logits_to_probs(logits, self.sampling)  # [rows, V']
        count = min(count, int((q > 0).sum(-1).min()))
        positions = torch.multinomial(q.cpu(), count, replacement=False, generator=self.generator).to(q.device)
        return positions, self.vocab.full_probs(q)

    @staticmethod
    def _ancestors(node: int, parents: list[int]) -> list[int]:
        out = []
        while parents[node] >= 0:
            node = parents[node]
            out.append(node)
        return out

    def _tree_forward(self, tokens: list[int], parents: list[int], new: list[int], n: int) -> torch.Tensor:
        """Feed the nodes `new` as pairs (their token, their parent's predicted feature) at depth positions with a
        tree mask over the cached context and the tree rows fed before; returns their predicted features [len, H].
        The mask is built on the host and copied once."""
        fed = self.network.length - n  # tree rows already in the head's cache: nodes 0 .. fed-1
        ids = torch.tensor([[tokens[i] for i in new]], device=self.device)
        features = torch.stack([self._outputs[parents[i]] for i in new])[None]
        ancestry = [self._ancestors(i, parents) for i in new]
        mask = torch.full((len(new), n + fed + len(new)), self._min_value, dtype=self.dtype)
        mask[:, :n] = 0
        for row, ancestors in enumerate(ancestry):
            mask[row, [n + a for a in ancestors] + [n + fed + row]] = 0
        positions = torch.tensor([[n + len(a) for a in ancestry]], device=self.device)
        out = self.network({"embeds": self.embed(ids), "features": features}, positions, mask.to(self.device))[0]
        for row, node in enumerate(new):
            self._outputs[node] = out[row]
        return out


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> Eagle1Drafter:
    """For the tests: this drafter at `knobs`' tree over a random head for a tiny target
    (tests/test_sampling_methods.py)."""
    head = random_weights(EagleHead(target.config), seed=2).to(target.dtype)
    return Eagle1Drafter(target, head=head, choices=knobs["choices"], sampling=sampling, seed=0)
