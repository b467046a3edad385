"""SuffixDecoding's frequency tree (Oliaro et al. 2024, arXiv 2411.04975; snowflakedb/ArcticInference
csrc/suffix_decoding): the suffixes of one or more token sequences, each cut to its first `max_depth` tokens, in a
trie whose node for a string counts its occurrences; and the draft that the counts choose after a context.

What it drafts, as arctic-inference 0.3.0's SuffixTree does:
- every match length m = 1 .. len(context) - 1 of the context's last tokens found in the trie (stopping at the first
  one that is not) proposes up to min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset)) tokens; the
  proposal with the highest score (the sum of its tokens' probabilities) wins, the longer match on a tie;
- a token's probability is the product of count(child) / count(parent) along its path from the match: the empirical
  frequency of that continuation; no token below `min_token_prob` is drafted;
- a path (a chain: the most frequent child each time) or, with `tree`, a tree grown greedily by probability (a
  best-first expansion over the continuations of every drafted node).
Probabilities and scores are float32 sums and products in upstream's order, so the choices are upstream's to the bit.

Equal counts are broken as upstream's sibling lists break them: children ordered by count, and within a count, a
child whose count rose while it was the first of its old count goes first in the new one, any other child last;
a child whose count fell goes first; a new child goes last. Upstream keeps that order in linked lists of count
groups; here each parent keeps an ordered dict per count (`groups`). The trie has a node per token where upstream
compresses single-child paths (same counts, same order; a node with one child keeps it without dicts, yet more
memory than upstream's). The best-first queue of `tree` pops equal
probabilities in the order of upstream's std::priority_queue (BinaryMaxHeap).

Cost: appending a token touches at most max_depth nodes (the sequence's open suffixes); a draft walks at most
max_depth matches of at most max_depth tokens, plus its own tokens: neither grows with the sequences' length.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

f32 = np.float32


class TrieNode:
    """A string's node: its occurrence count and its children. `children` is None (a leaf: most nodes), the only
    child itself (most of the rest: the dicts cost more memory than the node), or a dict token -> child, with
    `groups[c]` (token -> child) holding the children of count c in sibling order; `top` is the highest child count
    (0: no child)."""

    __slots__ = ("token", "count", "parent", "children", "groups", "top")

    def __init__(self, token: int, parent: TrieNode | None):
        self.token, self.parent, self.count, self.top = token, parent, 0, 0
        self.children: TrieNode | dict[int, TrieNode] | None = None
        self.groups: dict[int, OrderedDict[int, TrieNode]] | None = None

    def child(self, token: int) -> TrieNode | None:
        children = self.children
        if type(children) is TrieNode:
            return children if children.token == token else None
        return children.get(token) if children else None

    def first_child(self) -> TrieNode | None:
        """The most frequent child, upstream's head of the siblings."""
        if type(self.children) is TrieNode or not self.top:
            return self.children or None
        return next(iter(self.groups[self.top].values()))

    def ordered_children(self):
        """Every child, in sibling order."""
        if type(self.children) is TrieNode:
            yield self.children
            return
        for count in sorted(self.groups or (), reverse=True):
            yield from self.groups[count].values()


def _leave_group(child: TrieNode) -> bool:
    """Take `child` out of its count's group; True when it was the group's first."""
    group = child.parent.groups[child.count]
    first = next(iter(group)) == child.token
    del group[child.token]
    if not group:
        del child.parent.groups[child.count]
    return first


def _join_group(child: TrieNode, front: bool) -> None:
    parent = child.parent
    group = parent.groups.setdefault(child.count, OrderedDict())
    group[child.token] = child
    if front:
        group.move_to_end(child.token, last=False)


def _count_up(parent: TrieNode, token: int) -> TrieNode:
    """One more occurrence of parent's string + token (a new child last among the count-1 ones)."""
    only = parent.children
    if only is None or (type(only) is TrieNode and only.token == token):  # no sibling order to keep
        child = parent.children = only or TrieNode(token, parent)
        child.count += 1
        parent.top = child.count
        return child
    if type(only) is TrieNode:  # a second child: the dicts, the first child alone in its group
        parent.children, parent.groups = {only.token: only}, {only.count: OrderedDict({only.token: only})}
    child = parent.children.get(token)
    if child is None:
        child = parent.children[token] = TrieNode(token, parent)
        front = False
    else:
        front = _leave_group(child)
    child.count += 1
    _join_group(child, front)
    parent.top = max(parent.top, child.count)
    return child


def _count_down(child: TrieNode) -> bool:
    """One occurrence fewer (first among its new count); a child left with none is cut off. True if it was."""
    parent = child.parent
    if parent.children is child:  # the only child
        child.count -= 1
        parent.top = child.count
        if not child.count:
            parent.children = None
        return child.count == 0
    _leave_group(child)
    child.count -= 1
    if child.count:
        _join_group(child, front=True)
    else:
        del parent.children[child.token]
    if parent.top not in parent.groups:
        parent.top = child.count  # the top group emptied: the child is now the most frequent (or none is left)
    return child.count == 0


@dataclass
class Draft:
    """A proposal: node tokens, their parents (-1: under the root), probabilities, score (their float32 sum) and
    the length of the context match it continues."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def add(self, token: int, parent: int, prob) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(float(prob))
        self.score = float(f32(self.score) + f32(prob))
        return len(self.tokens) - 1


class SuffixTrie:
    """The depth-limited suffixes of sequences (each under its own id) with their counts (see module doc)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = TrieNode(-1, None)
        self.sequences: dict[int, list[int]] = {}
        self.open_suffixes: dict[int, deque[TrieNode]] = {}  # per sequence, the nodes of its last max_depth suffixes

    def extend(self, seq_id: int, tokens) -> None:
        """Append tokens to sequence `seq_id` (a new one when unknown)."""
        sequence = self.sequences.setdefault(seq_id, [])
        suffixes = self.open_suffixes.setdefault(seq_id, deque(maxlen=self.max_depth))
        for token in tokens:
            token = int(token)
            sequence.append(token)
            self.root.count += 1
            suffixes.append(self.root)  # the suffix that starts here; one max_depth tokens old drops out
            for index in range(len(suffixes)):
                suffixes[index] = _count_up(suffixes[index], token)

    def remove(self, seq_id: int) -> None:
        """Forget sequence `seq_id`: every suffix of it counts one occurrence fewer."""
        sequence = self.sequences.pop(seq_id)
        del self.open_suffixes[seq_id]
        for start in range(len(sequence)):
            self.root.count -= 1
            node = self.root
            for token in sequence[start : start + self.max_depth]:
                child = node.child(token)
                if child is None or _count_down(child):
                    break
                node = child

    def match(self, pattern) -> TrieNode | None:
        node = self.root
        for token in pattern:
            node = node.child(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1, tree: bool = False) -> Draft:
        """The best-scoring draft over every match length of the context's end (see module doc)."""
        best = Draft()
        grow = self._grow_tree if tree else self._grow_path
        for match_len in range(1, len(context)):
            node = self.match(context[len(context) - match_len :])
            if node is None:
                break
            scaled = float(f32(f32(match_len) * f32(max_spec_factor)) + f32(max_spec_offset)) + 1e-6
            draft = grow(node, max(min(max_spec_tokens, int(scaled)), 0), f32(min_token_prob))
            if draft.score >= best.score:
                best, draft.match_len = draft, match_len
        return best

    @staticmethod
    def _grow_path(node: TrieNode, limit: int, min_prob) -> Draft:
        """The chain of most frequent children while their probability stays >= min_prob."""
        draft, prob = Draft(), f32(1.0)
        while len(draft.tokens) < limit and prob >= min_prob:
            child = node.first_child()
            if child is None:
                break
            if child.count != node.count:  # a branch point (upstream: the end of a compressed node)
                prob = f32(prob * (f32(child.count) / f32(node.count)))
                if prob < min_prob:
                    break
            draft.add(child.token, len(draft.tokens) - 1, prob)
            node = child
        return draft

    @staticmethod
    def _grow_tree(node: TrieNode, limit: int, min_prob) -> Draft:
        """Best-first: the most probable open continuation next, `limit` tokens at most."""
        draft = Draft()
        # items: (prob, node whose continuations are open or None, node to draft or None, parent index)
        queue = BinaryMaxHeap([(f32(1.0), node, None, -1)])
        while len(draft.tokens) < limit and queue:
            prob, after, drafted, parent = queue.pop()
            if drafted is None:
                single = after.first_child()
                if single is None or single.count != after.count:  # a branch point: open every likely child
                    for child in after.ordered_children():
                        child_prob = f32(f32(prob * f32(child.count)) / f32(after.count))
                        if child_prob < min_prob:
                            break
                        queue.push((child_prob, None, child, parent))
                    continue
                drafted = single  # inside upstream's compressed node: the one continuation, same probability
            queue.push((prob, drafted, None, draft.add(drafted.token, parent, prob)))
        return draft


class BinaryMaxHeap:
    """A max-heap of tuples by their first item that pops equal ones in the order C++'s std::priority_queue does
    (libstdc++'s push_heap / pop_heap: sift up; on a pop, the hole goes down the larger children to a leaf, then the
    last item sifts up from there), so that the draft tree breaks probability ties as upstream's."""

    def __init__(self, items: list):
        self.items: list = []
        for item in items:
            self.push(item)

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item) -> None:
        self.items.append(item)
        self._sift_up(len(self.items) - 1, 0, item)

    def pop(self):
        items = self.items
        top, last = items[0], items.pop()
        if items:
            hole, size = 0, len(items)
            child = 0
            while child < (size - 1) // 2:
                child = 2 * (child + 1)
                if items[child][0] < items[child - 1][0]:
                    child -= 1
                items[hole], hole = items[child], child
            if size % 2 == 0 and child == (size - 2) // 2:
                child = 2 * (child + 1)
                items[hole], hole = items[child - 1], child - 1
            self._sift_up(hole, 0, last)
        return top

    def _sift_up(self, hole: int, top: int, item) -> None:
        items = self.items
        parent = (hole - 1) // 2
        while hole > top and items[parent][0] < item[0]:
            items[hole], hole = items[parent], parent
            parent = (hole - 1) // 2
        items[hole] = item
