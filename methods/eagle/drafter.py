"""The EAGLE drafters' shared part: an EAGLE head (or EAGLE-3's) kept in step with the accepted context.

The head keeps its own KV cache over (token, feature) pairs: after each verification it consumes the target's
features at the accepted rows, so its cache always holds the accepted context; the tree's rows are dropped again
after drafting. What tree it drafts from the root's predicted feature is the subclass's: EAGLE-1's static one
(methods/eagle/static.py) or EAGLE-2's dynamic one (methods/eagle/dynamic.py).
"""
from __future__ import annotations

import torch

from bench.engine.drafter import Drafter
from bench.engine.kvcache import new_cache
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

    # --- the head's view of the accepted context ---------------------------------------------------------------

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None, seed: int | None = None) -> None:
        """Per turn: an empty head cache, the prompt's features pending, and the draws (sampling only) from `seed`
        (the engine's drafter seed), or, when the turn has none, from the constructor's `seed`."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.cache = new_cache()  # plain layers: the tree rows can be cropped off again
        self.context_len = 0  # cache length before the last drafted tree (update may come before any proposal)
        self.pending = hidden  # [m, H] target features not yet fed to the head (positions cache_len .. +m-1)

    def update(self, step) -> None:
        surplus = self.cache.get_seq_length() - self.context_len  # the drafted tree's rows
        if surplus:
            self.cache.crop(-surplus)
        accepted = step.hidden[step.acceptance.rows]  # features of the root and the accepted nodes
        self.pending = torch.cat([self.pending, accepted]) if len(self.pending) else accepted

    def _feed_pending(self, context: list[int]) -> torch.Tensor:
        """Feed (token t+1, f_t) for the pending features; returns the head's output at the last one (f^ of the
        root's position). Afterwards the cache holds every position up to the root's predecessor."""
        start = self.cache.get_seq_length()
        tokens = torch.tensor([context[start + 1 : start + 1 + len(self.pending)]], device=self.device)
        out = self.head(self.embed(tokens), self.pending[None], cache=self.cache)
        self.pending = self.pending[:0]
        self.context_len = self.cache.get_seq_length()
        return out[0, -1]

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
            return None
        return self.draft_tree(self._feed_pending(context))  # f^ at the root's position: predicts the depth-1 tokens

    def draft_tree(self, root_feature: torch.Tensor) -> DraftTree | None:
        """The tree to verify, drafted from the head's predicted feature at the root's position [H]."""
        raise NotImplementedError
