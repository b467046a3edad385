"""DFlash's drafter (`method=dflash`): one drafter forward per step drafts a block, verified as a chain."""
from __future__ import annotations

import torch

from bench.engine.drafter import Drafter, StepResult
from bench.engine.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs, null_or
from methods.dflash.checkpoints import drafter_config, load_dflash, published_config
from methods.dflash.head import DFlashDrafter as DFlashModule
from methods.heads.common import DraftVocabulary, heads_or_checkpoint
from methods.heads.tiny import random_weights


class DFlashDrafter(Drafter):
    """Drafts as the dflash package's `dflash_generate`: the block [root, mask x (block_size - 1)] at the root's
    position and after, one drafter forward over it that attends to the target's features of every earlier
    position (kept as per-layer keys / values, fed the accepted rows after each step), its rows 1 .. block_size-1
    through the target's LM head (or the checkpoint's draft-vocabulary slice of it): greedy, their argmax; sampled,
    one draw per row from the row's distribution processed as the target's (q of each node). The chain is verified
    by the engine's lossless rules. Near the end of a turn the block shrinks to what the step may still add, as
    upstream's `verify_size`."""

    knob_rules = {"block_size": null_or(at_least(2))}
    samples = True

    def __init__(self, target, tokenizer=None, checkpoint: str = "", block_size: int | None = None,
                 sampling: SamplingConfig | None = None, seed: int | None = None, drafter: DFlashModule | None = None,
                 vocab: DraftVocabulary | None = None):
        check_knobs(DFlashDrafter, block_size=block_size)
        self.module, self.vocab, self.artifact = heads_or_checkpoint(drafter, vocab, checkpoint, target, load_dflash)
        self.block_size = block_size or self.module.block_size
        self.feature_layers = self.module.feature_layers
        self.embedding = target.get_input_embeddings().weight  # raw rows, as upstream reads them (no model scaling)
        self.sampling = sampling or SamplingConfig()
        self.fallback_seed, self.generator = seed, None  # start() seeds the generator for each turn
        self.device = target.device

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None, seed: int | None = None) -> None:
        """Per turn: no context keys yet, the prompt's features pending, the draws (sampling only) from `seed`."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.context: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, keys / values [1, kv, C, d]
        self.context_len = 0
        self.pending = hidden  # [m, F]: the target's features of positions context_len .. context_len + m - 1

    def update(self, step: StepResult) -> None:
        accepted = step.hidden[step.acceptance.rows]  # the root's and the accepted nodes' features
        self.pending = torch.cat([self.pending, accepted]) if len(self.pending) else accepted

    def _feed_pending(self) -> None:
        """The pending features' keys / values appended to the context's."""
        if not len(self.pending):
            return
        positions = torch.arange(self.context_len, self.context_len + len(self.pending), device=self.device)[None]
        fresh = self.module.context_cache(self.pending[None].to(self.module.fc.weight.dtype), positions)
        self.context = fresh if self.context is None else [
            (torch.cat([k, new_k], dim=2), torch.cat([v, new_v], dim=2))
            for (k, v), (new_k, new_v) in zip(self.context, fresh, strict=True)]
        self.context_len += len(self.pending)
        self.pending = self.pending[:0]

    def most_nodes(self) -> int:
        return self.block_size - 1

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        drafts = min(self.block_size, max_tokens) - 1  # a step adds the accepted drafts + the target's next token
        if drafts <= 0:
            return None
        self._feed_pending()
        root = len(context) - 1  # the context holds every position before the root
        ids = torch.full((1, drafts + 1), self.module.mask_token_id, dtype=torch.long, device=self.device)
        ids[0, 0] = context[-1]
        positions = torch.arange(root, root + drafts + 1, device=self.device)[None]
        embedded = torch.nn.functional.embedding(ids, self.embedding) * self.module.input_embedding_scale
        out = self.module(embedded.to(self.module.fc.weight.dtype), positions, self.context)
        logits = self.module.scale_logits(self.vocab(out[0, 1:]))  # [drafts, V']
        if self.sampling.greedy:
            return DraftTree.chain(self.vocab.to_token_ids(greedy_tokens(logits)).tolist())
        q = self.vocab.full_probs(logits_to_probs(logits, self.sampling)).cpu()  # [drafts, vocab]
        return DraftTree.chain([sample(row, self.generator) for row in q], q)


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> DFlashDrafter:
    """For the tests: this drafter at `knobs` over a random one-layer drafter for a tiny target
    (tests/test_sampling_methods.py)."""
    layers = target.config.num_hidden_layers
    config = published_config(target.config, 1, [0, layers - 1], block_size=4, mask_token_id=3)
    module = random_weights(DFlashModule(*drafter_config(config)), seed=5).to(target.dtype)
    return DFlashDrafter(target, drafter=module, sampling=sampling, seed=0, **knobs)
