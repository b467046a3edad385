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

Ours differs from upstream (lade 0.0.2, `jacobi_greedy_search_multilevel`) in four ways; three knobs select
upstream's behaviour instead:
- `initial_window`: ours is full from the first step, every guess drawn from the context, and a column's n-gram
  enters the pool only once the column has taken N-2 Jacobi steps since it was filled. `upstream` does as lade
  does: W+N-3 context tokens form the base (lade: `random.seed(10)`, so `seed: 10` draws lade's tokens), the
  levels grow by one per step (level k+1 = the predictions of level k, one column to the left), and once N-2 levels
  are there every column's n-gram is pooled each step, freshly guessed columns too. Lade takes its first Jacobi
  step inside the prompt's prefill forward; the engine's prefill carries no window, so here it is one forward later.
- `max_accept`: ours can accept a whole pooled n-gram plus the target's next token, N tokens a step. Lade's match
  loop stops one short (a full match leaves its counter at N-2), so it accepts at most N-1: `n_minus_1` verifies
  only the first N-2 tokens of each n-gram.
- `slide`: after k accepted tokens ours slides the window k columns so that every guess keeps its position, and
  fills the emptied right columns with fresh guesses (lade's ALWAYS_FWD_ONE=0); `one` slides one column whatever
  was accepted (lade's default ALWAYS_FWD_ONE=1).
"""
from __future__ import annotations

import functools
import random

import torch

from bench.engine.drafter import Drafter
from bench.engine.sampling import greedy_tokens
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs, one_of

INITIAL_WINDOWS = ("ours", "upstream")
MAX_ACCEPTS = ("n", "n_minus_1")
SLIDES = ("accepted", "one")


@functools.cache
def window_layout(columns: int, levels: int) -> tuple[list[int], torch.Tensor]:
    """Depths (relative to the root) and [m, m] attention of a window's aux nodes: a base of `columns` - 1 guesses,
    then `levels` levels of `columns` guesses each (level 1, 2, ...)."""
    base = columns - 1
    m = base + levels * columns
    mask = torch.zeros(m, m, dtype=torch.bool)
    depths = []
    for i in range(base):
        mask[i, : i + 1] = True
        depths.append(i + 1)
    for level in range(1, levels + 1):
        for j in range(columns):
            row = base + (level - 1) * columns + j
            mask[row, :j] = True  # base[:j]
            for seen in range(1, level + 1):  # its own column, levels 1..level
                mask[row, base + (seen - 1) * columns + j] = True
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
    knob_rules = {"window_size": at_least(2), "ngram_size": at_least(3), "guess_set_size": at_least(0),
                  "initial_window": one_of(*INITIAL_WINDOWS), "max_accept": one_of(*MAX_ACCEPTS),
                  "slide": one_of(*SLIDES)}

    def __init__(self, target=None, tokenizer=None, window_size: int = 15, ngram_size: int = 5,
                 guess_set_size: int = 15, seed: int = 0, initial_window: str = "ours", max_accept: str = "n",
                 slide: str = "accepted"):
        check_knobs(type(self), window_size=window_size, ngram_size=ngram_size, guess_set_size=guess_set_size,
                    seed=seed, initial_window=initial_window, max_accept=max_accept, slide=slide)
        self.W, self.N, self.G, self.seed = window_size, ngram_size, guess_set_size, seed
        self.initial_window, self.max_accept, self.slide = initial_window, max_accept, slide
        self.max_draft = ngram_size - 1 if max_accept == "n" else ngram_size - 2  # pooled tokens verified per n-gram

    def start(self, prompt_ids: list[int]) -> None:
        """A fresh pool and window per turn: full of context tokens (ours), or lade's W+N-3 base and no levels."""
        self.rng = random.Random(self.seed)
        self.context = list(prompt_ids)
        self.pool: dict[int, dict[tuple[int, ...], None]] = {}  # key token -> n-gram tails, least recent first
        if self.initial_window == "upstream":
            self.base, self.levels = self._guesses(self.W + self.N - 3), []
        else:
            self.base = self._guesses(self.W - 1)
            self.levels = [self._guesses(self.W) for _ in range(self.N - 2)]
        self.column_age = [0] * self.W  # Jacobi steps each column has taken since it was filled with guesses
        self.root = None

    def _guesses(self, count: int) -> list[int]:
        return [self.rng.choice(self.context) for _ in range(count)]

    @property
    def window_full(self) -> bool:
        return len(self.levels) == self.N - 2

    def remember(self, key: int, tail: tuple[int, ...]) -> None:
        """Add an n-gram to the pool; each key keeps its `guess_set_size` most recently seen tails."""
        tails = self.pool.setdefault(key, {})
        tails.pop(tail, None)
        tails[tail] = None
        if len(tails) > self.G:
            del tails[next(iter(tails))]

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:  # the next token is the last one: nothing to speculate on
            return None
        self.context, self.root = context, context[-1]
        tails = self.pool.get(self.root, {})
        tokens, parents = trie(tail[: min(max_tokens - 1, self.max_draft)] for tail in tails)
        aux_depths, aux_mask = window_layout(len(self.base) + 1, len(self.levels))
        aux_tokens = self.base + [token for level in self.levels for token in level]
        return DraftTree(tokens, parents, aux_tokens=aux_tokens, aux_depths=aux_depths, aux_mask=aux_mask)

    def update(self, step) -> None:
        if step.tree is None:
            return
        top_rows = len(self.levels[-1]) if self.levels else len(self.base)
        top = greedy_tokens(step.logits[-top_rows:]).tolist()  # predictions after the top level (the base, if none)
        if not self.window_full:  # upstream's growing window: no n-gram is finished yet
            self._grow(top)
            return
        keys = [self.root] + self.base
        for j, age in enumerate(self.column_age):
            if self.initial_window == "upstream" or age >= self.N - 2:  # ours: levels 1..N-2 all came out of Jacobi
                self.remember(keys[j], tuple(level[j] for level in self.levels) + (top[j],))
        advance = 1 if self.slide == "one" else len(step.acceptance.tokens)
        self._slide(levels=self.levels + [top], advance=advance)

    def _grow(self, top: list[int]) -> None:
        """Upstream's window before it is full, one accepted token on: every row moves one column left and the top
        level's predictions become a new level (the base's, all of them, after the first step)."""
        self.levels = [level[1:] for level in self.levels] + [top[1:] if self.levels else top]
        self.base = self.base[1:]

    def _slide(self, levels: list[list[int]], advance: int) -> None:
        """Re-anchor the window on the new root, `advance` positions on: level l+1 becomes level l, shifted left by
        advance - 1 columns so that every guess keeps its position; the emptied right columns get fresh guesses."""
        shift = min(advance - 1, self.W)
        levels = [level[shift:] + self._guesses(shift) for level in levels]
        self.base = levels[0][1:]  # levels[0][0] guessed the new root's position, which is now known
        self.levels = levels[1:]
        self.column_age = [age + 1 for age in self.column_age[shift:]] + [0] * shift
