"""PARD's drafter (`method=pard`): one draft forward over the new context tokens followed by K-1 mask tokens
proposes K tokens, verified by the target as a chain.

Draft-side cache, as upstream's `pard_infer.py` keeps it: the forward appends the new real tokens and the K-1 masks
to the draft's cache, and the masks' entries are dropped again (upstream moves its static cache's length back by
K-1, so the next forward overwrites them), leaving the cache holding the context's real tokens only; the drafted
tokens themselves never enter the draft's cache, so a rejection needs no rewind: the next forward starts with the
accepted tokens and the target's own token.
"""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.pard.checkpoints import parallel_token
from methods.sps.drafter import DraftModelDrafter


class ParallelDraftDrafter(DraftModelDrafter):
    """K = `num_draft_tokens` tokens per draft forward: position 0 reads the last real token, position k the k-th
    mask token (the draft's config `pard_token`). Under sampling each position's token is drawn from its own
    distribution, which is also its q for the acceptance rule; under greedy each is its argmax. K is fixed."""

    knob_rules = {"num_draft_tokens": at_least(1)}

    def __init__(self, target, tokenizer=None, draft_path: str | None = None, num_draft_tokens: int = 12,
                 sampling: SamplingConfig | None = None, seed: int | None = None, draft_model=None,
                 train_command: str = "python -m bench.train method=pard"):
        check_knobs(ParallelDraftDrafter, num_draft_tokens=num_draft_tokens)
        super().__init__(target, tokenizer, draft_path, num_draft_tokens, adaptive=False, sampling=sampling,
                         seed=seed, draft_model=draft_model, train_command=train_command)
        self.mask_token_id = parallel_token(self.draft.config, draft_path or "the draft model", train_command)

    @torch.inference_mode()
    def precompile(self) -> None:
        """The draft's graphs for a step's forward: the tokens accepted since the last one (at most K + 1) and K - 1
        masks."""
        self.network.precompile({"input_ids": torch.zeros(1, 1, dtype=torch.long, device=self.draft.device)},
                                2 * self.initial_draft_tokens)

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        n = self.chain_length(context, max_tokens)
        if n <= 0:
            return None
        known = self.network.length
        ids = torch.tensor([context[known:] + [self.mask_token_id] * (n - 1)], device=self.draft.device)
        logits = self.network({"input_ids": ids}, logits_to_keep=n)[0]  # [n, vocab]
        self.network.cut_to(self.network.length - (n - 1))  # the masks' entries go: the context's real tokens stay
        if self.sampling.greedy:
            return DraftTree.chain(greedy_tokens(logits).tolist())
        q = logits_to_probs(logits, self.sampling).cpu()  # [n, vocab]
        return DraftTree.chain([sample(row, self.generator) for row in q], q)


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> ParallelDraftDrafter:
    """For the tests: a draft of a tiny target's own two layers with its final norm flattened (q overlaps p: steps
    both accept and reject), mask token 3, at `knobs`' K (tests/test_sampling_methods.py)."""
    from methods.pard.checkpoints import mark_parallel
    from methods.sps.draft import slice_target

    draft = slice_target(target, [0, 1])
    mark_parallel(draft.config, 3)
    with torch.no_grad():
        draft.model.norm.weight.mul_(0.3)
    return ParallelDraftDrafter(target, draft_model=draft, num_draft_tokens=knobs["num_draft_tokens"],
                                sampling=sampling, seed=0)
