"""The EAGLE drafters' shared part: an EAGLE head (or EAGLE-3's) kept in step with the accepted context.

The head keeps its own KV cache over (token, feature) pairs: after each verification it consumes the target's
features at the accepted rows, so its cache always holds the accepted context; the tree's rows are dropped again
after drafting. The head runs eager over a DynamicCache, or under engine.compile=on compiled over a preallocated
cache (bench/engine/drafter_network.py), the same calls either way. What tree it drafts from the root's predicted
feature is the subclass's: EAGLE-1's static one (methods/eagle/static.py) or EAGLE-2's dynamic one
(methods/eagle/dynamic.py).
"""
from __future__ import annotations

import torch

from bench.engine.compiled import BUCKETS
from bench.engine.drafter import Drafter
from bench.engine.drafter_network import EagerForward, StaticForward
from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from methods.eagle.checkpoints import load_eagle
from methods.eagle.head import EagleHead
from methods.heads.common import DraftVocabulary, heads_or_checkpoint


class EagleDrafter(Drafter):
    """An EAGLE head over the accepted context; `draft_tree` (the subclass's) drafts from the root's feature."""

    feature_layers = (-1,)
    samples = True

    def __init__(self, target, checkpoint: str | None = "", sampling: SamplingConfig | None = None,
                 seed: int | None = None, head: EagleHead | None = None, vocab: DraftVocabulary | None = None):
        self.head, self.vocab, self.artifact = heads_or_checkpoint(head, vocab, checkpoint, target, load_eagle)
        self.embed = target.get_input_embeddings()
        self.sampling = sampling or SamplingConfig()
        self.fallback_seed, self.generator = seed, None  # start() seeds the generator for each turn
        self.device, self.dtype = target.device, target.dtype
        self._min_value = torch.finfo(target.dtype).min
        self.network = EagerForward(self._head_forward)  # the head over its cache (reserve: compiled)
        self.target_hidden = target.config.get_text_config().hidden_size

    def _head_forward(self, cache, position_ids, attention_mask, embeds, features):
        return self.head(embeds, features, cache=cache, position_ids=position_ids, attention_mask=attention_mask)

    def reserve(self, positions: int) -> None:
        if not self.network.compiled:
            self.network = StaticForward(self._head_forward, self.head.config, self.head)
        self.network.reserve(positions)

    def precompile(self) -> None:
        """The head's graphs for the rows it is fed: the target's features (the accepted rows) and its own outputs
        (the tree's levels), up to `fed_rows()` rows."""
        embeds = self.embed(torch.zeros(1, 1, dtype=torch.long, device=self.device))
        target_features = len(self.feature_layers) * self.target_hidden
        for width in dict.fromkeys((target_features, self.head.config.hidden_size)):
            features = torch.zeros(1, 1, width, dtype=self.dtype, device=self.device)
            with torch.inference_mode():
                self.network.precompile({"embeds": embeds, "features": features}, min(self.fed_rows(), BUCKETS[-1]))

    def fed_rows(self) -> int:
        """The most rows one head forward is fed after the prompt's (a tree level, or a step's accepted rows)."""
        raise NotImplementedError

    # --- the head's view of the accepted context ---------------------------------------------------------------

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None, seed: int | None = None) -> None:
        """Per turn: an empty head cache, the prompt's features pending, and the draws (sampling only) from `seed`
        (the engine's drafter seed), or, when the turn has none, from the constructor's `seed`."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.network = self.network.for_new_turn()
        self.context_len = 0  # cache length before the last drafted tree (update may come before any proposal)
        self.pending = hidden  # [m, H] target features not yet fed to the head (positions cache_len .. +m-1)

    def update(self, step) -> None:
        self.network.cut_to(self.context_len)  # the drafted tree's rows out
        accepted = step.hidden[step.acceptance.rows]  # features of the root and the accepted nodes
        self.pending = torch.cat([self.pending, accepted]) if len(self.pending) else accepted

    def _feed_pending(self, context: list[int]) -> torch.Tensor:
        """Feed (token t+1, f_t) for the pending features; returns the head's output at the last one (f^ of the
        root's position). Afterwards the cache holds every position up to the root's predecessor."""
        start = self.network.length
        tokens = torch.tensor([context[start + 1 : start + 1 + len(self.pending)]], device=self.device)
        out = self.network({"embeds": self.embed(tokens), "features": self.pending[None]})
        self.pending = self.pending[:0]
        self.context_len = self.network.length
        return out[0, -1]

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
            return None
        return self.draft_tree(self._feed_pending(context))  # f^ at the root's position: predicts the depth-1 tokens

    def draft_tree(self, root_feature: torch.Tensor) -> DraftTree | None:
        """The tree to verify, drafted from the head's predicted feature at the root's position [H]."""
        raise NotImplementedError
