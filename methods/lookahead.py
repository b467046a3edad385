"""Lookahead decoding (Fu et al. 2024; hao-ai-lab/LookaheadDecoding) as a drafter for the shared engine.

Every target forward does two things at once:
- lookahead branch: a 2-D window of guesses for the next positions takes one Jacobi step. Its W columns each hold
  a chain key, level 1, ..., level N-2 at consecutive positions; the forward predicts level N-1 of every column,
  and the finished N-grams (key, levels 1..N-1) go into a pool keyed by their first token;
- verification branch: up to G pooled n-grams that start with the root are verified as a token trie.
The window rides along as the DraftTree's auxiliary nodes, which the engine scores but never accepts.

Window layout, with the root at position p: `base[i]` (i < W-1) guesses position p+1+i and is the key of column
i+1 (the root is column 0's key); `levels[l-1][j]` guesses position p+j+l. Level l of column j attends to the root,
base[:j] and levels 1..l of its own column, which is the upstream attention mask.

Two choices differ from upstream's greedy path: the window is full from the first step (a column's n-grams enter the
pool once it has taken N-2 Jacobi steps, where upstream grows the levels one step at a time), and after k accepted
tokens it slides k columns, not always one, so that each guess keeps its position (upstream's ALWAYS_FWD_ONE=0).
"""
from __future__ import annotations

import random

import torch

from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree


def window_layout(window_size: int, ngram_size: int) -> tuple[list[int], torch.Tensor]:
    """Depths (relative to the root) and [m, m] attention of the window's aux nodes: base, then level 1, 2, ..."""
    W, levels = window_size, ngram_size - 2
    m = (W - 1) + levels * W
    mask = torch.zeros(m, m, dtype=torch.bool)
    depths = []
    for i in range(W - 1):
        mask[i, : i + 1] = True
        depths.append(i + 1)
    for level in range(1, levels + 1):
        for j in range(W):
            row = (W - 1) + (level - 1) * W + j
            mask[row, :j] = True  # base[:j]
            for seen in range(1, level + 1):  # its own column, levels 1..level
                mask[row, (W - 1) + (seen - 1) * W + j] = True
            depths.append(j + level)
    return depths, mask


def trie(sequences) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the token trie holding every sequence; shared prefixes share nodes."""
    tokens, parents, node_of = [], [], {}
    for sequence in sequences:
        parent = -1
        for token in sequence:
            node = node_of.get((parent, token))
            if node is None:
                node = node_of[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = node
    return tokens, parents


class LookaheadDrafter(Drafter):
    def __init__(self, target=None, tokenizer=None, window_size: int = 15, ngram_size: int = 5,
                 guess_set_size: int = 15, seed: int = 0):
        if window_size < 2 or ngram_size < 3 or guess_set_size < 0:
            raise ValueError(f"bad lookahead knobs: {window_size=}, {ngram_size=}, {guess_set_size=}")
        self.W, self.N, self.G, self.seed = window_size, ngram_size, guess_set_size, seed
        self.aux_depths, self.aux_mask = window_layout(window_size, ngram_size)

    def start(self, prompt_ids: list[int]) -> None:
        """A fresh pool and a window filled with prompt tokens (upstream's initial guess), per turn."""
        self.rng = random.Random(self.seed)
        self.context = list(prompt_ids)
        self.pool: dict[int, dict[tuple[int, ...], None]] = {}  # key token -> n-gram tails, least recent first
        self.base = self._guesses(self.W - 1)
        self.levels = [self._guesses(self.W) for _ in range(self.N - 2)]
        self.column_age = [0] * self.W  # Jacobi steps each column has taken since it was filled with guesses
        self.root = None

    def _guesses(self, count: int) -> list[int]:
        return [self.rng.choice(self.context) for _ in range(count)]

    def remember(self, key: int, tail: tuple[int, ...]) -> None:
        """Add an n-gram to the pool; each key keeps its `guess_set_size` most recently seen tails."""
        tails = self.pool.setdefault(key, {})
        tails.pop(tail, None)
        tails[tail] = None
        if len(tails) > self.G:
            del tails[next(iter(tails))]

    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        if budget <= 1:  # the next token is the last one: nothing to speculate on
            return None
        self.context, self.root = context, context[-1]
        tails = self.pool.get(self.root, {})
        tokens, parents = trie(tail[: budget - 1] for tail in tails)
        aux_tokens = self.base + [token for level in self.levels for token in level]
        return DraftTree(tokens, parents, aux_tokens=aux_tokens, aux_depths=self.aux_depths, aux_mask=self.aux_mask)

    def update(self, step) -> None:
        if step.tree is None:
            return
        top = step.logits[-self.W :].argmax(-1).tolist()  # predictions after the top level: level N-1
        keys = [self.root] + self.base
        for j, age in enumerate(self.column_age):
            if age >= self.N - 2:  # levels 1..N-2 all came out of Jacobi steps
                self.remember(keys[j], tuple(level[j] for level in self.levels) + (top[j],))
        self._slide(levels=self.levels + [top], advance=len(step.acceptance.tokens))

    def _slide(self, levels: list[list[int]], advance: int) -> None:
        """Re-anchor the window on the new root, `advance` positions on: level l+1 becomes level l, shifted left by
        advance - 1 columns so that every guess keeps its position; the emptied right columns get fresh guesses."""
        shift = min(advance - 1, self.W)
        levels = [level[shift:] + self._guesses(shift) for level in levels]
        self.base = levels[0][1:]  # levels[0][0] guessed the new root's position, which is now known
        self.levels = levels[1:]
        self.column_age = [age + 1 for age in self.column_age[shift:]] + [0] * shift
