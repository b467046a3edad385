"""SpS's drafter (`method=sps`): the draft model autoregresses a chain of γ tokens with its own KV cache."""
from __future__ import annotations

import torch

from bench.artifacts import artifact_fingerprint
from bench.engine.drafter import Drafter, StepResult
from bench.engine.drafter_network import EagerForward, StaticForward
from bench.engine.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.sps.draft import load_draft, resolve_draft_path, slice_target


class DraftModelDrafter(Drafter):
    """Proposes a chain of `num_draft_tokens` (γ) tokens sampled (or, under greedy, argmax-picked) from the draft.

    Spec-Bench ran transformers 4.36's assisted generation, whose defaults were γ = 5 and the "heuristic" schedule;
    `adaptive` is that schedule (γ + 2 after a fully accepted chain, else γ - 1, at least 1), reset every turn.
    `sampling` must be the run's SamplingConfig so that q is processed like p; without it the draft proposes its
    argmax with q = None, which the acceptance rule treats as a deterministic (still lossless) proposal.
    """

    knob_rules = {"num_draft_tokens": at_least(1)}

    samples = True
    partial_drafts = True  # asked for k tokens (max_tokens = k + 1), it drafts k: one draft forward each

    def __init__(self, target, tokenizer=None, draft_path: str | None = None, num_draft_tokens: int = 5,
                 adaptive: bool = True, sampling: SamplingConfig | None = None, seed: int | None = None,
                 draft_model=None, train_command: str = "python -m bench.train method=sps"):
        check_knobs(DraftModelDrafter, num_draft_tokens=num_draft_tokens)
        self.draft = draft_model if draft_model is not None else load_draft(draft_path, target, train_command)
        # Identifies the weights in run keys (None for a model passed in).
        self.artifact = (artifact_fingerprint(resolve_draft_path(draft_path) or draft_path) if draft_model is None
                         else None)
        self.initial_draft_tokens = self.num_draft_tokens = num_draft_tokens
        self.adaptive = adaptive
        self.sampling = sampling or SamplingConfig()
        self.fallback_seed, self.generator = seed, None  # start() seeds the generator for each turn
        self.network = EagerForward(self._draft_forward)  # the draft over its cache (reserve: compiled)
        self._base = 0  # len(context) at the last proposal: the cache length to keep before accepted drafts

    def _draft_forward(self, cache, position_ids, attention_mask, input_ids, **options):
        return self.draft(input_ids=input_ids, cache=cache, position_ids=position_ids, attention_mask=attention_mask,
                          **options).logits

    def most_nodes(self) -> int | None:
        """γ, or None under the adaptive schedule (it grows γ by 2 after each fully accepted chain)."""
        return None if self.adaptive else self.initial_draft_tokens

    def reserve(self, positions: int) -> None:
        if not self.network.compiled:
            self.network = StaticForward(self._draft_forward, self.draft.config, self.draft)
        self.network.reserve(positions)

    @torch.inference_mode()
    def precompile(self) -> None:
        """The draft's graphs for a step's first forward (the root, and the last draft when all were kept) and the
        chain's next ones."""
        self.network.precompile({"input_ids": torch.zeros(1, 1, dtype=torch.long, device=self.draft.device)}, 2)

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], seed: int | None = None) -> None:
        """A fresh draft cache and γ; the draws come from `seed` (the engine's drafter seed for this turn), or, when
        the turn has none, from the constructor's `seed` (None: torch's global generator)."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.num_draft_tokens = self.initial_draft_tokens
        self._base = len(prompt_ids)  # the cache to keep should an update come before any proposal
        self.network = self.network.for_new_turn()  # a copy per batch row: a cache of its own
        self.network({"input_ids": torch.tensor([prompt_ids], device=self.draft.device)}, logits_to_keep=1)

    def chain_length(self, context: list[int], max_tokens: int) -> int:
        """How many tokens this step drafts (a step adds accepted drafts + 1 bonus token); notes the context's
        length, the cache update() keeps before the accepted drafts."""
        self._base = len(context)
        return min(self.num_draft_tokens, max_tokens - 1)

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        n = self.chain_length(context, max_tokens)
        if n <= 0:
            return None
        # the root, plus the last chain's final draft if all were kept
        ids = torch.tensor([context[self.network.length:]], device=self.draft.device)
        drafted, probs = [], []
        for _ in range(n):
            logits = self.network({"input_ids": ids})[0, -1]  # [vocab]
            if self.sampling.greedy:  # stays on the device: one host sync per chain, not per token
                ids = greedy_tokens(logits).view(1, 1)
            else:  # the sampler's generator lives on the CPU
                q = logits_to_probs(logits, self.sampling).cpu()  # [vocab]
                ids = torch.tensor([[sample(q, self.generator)]], device=self.draft.device)
                probs.append(q)
            drafted.append(ids)
        return DraftTree.chain(torch.cat(drafted).flatten().tolist(), torch.stack(probs) if probs else None)

    def update(self, step: StepResult) -> None:
        accepted = step.acceptance.num_accepted_drafts
        self.network.cut_to(min(self.network.length, self._base + accepted))  # context + accepted drafts
        if self.adaptive and step.tree is not None and len(step.tree):
            full = accepted == len(step.tree)
            self.num_draft_tokens = self.num_draft_tokens + 2 if full else max(1, self.num_draft_tokens - 1)


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> DraftModelDrafter:
    """For the tests: a draft of a tiny target's own two layers with its final norm flattened (q overlaps p: steps
    both accept and reject), at `knobs`' γ and schedule (tests/test_sampling_methods.py)."""
    draft = slice_target(target, [0, 1])
    with torch.no_grad():
        draft.model.norm.weight.mul_(0.3)
    return DraftModelDrafter(target, draft_model=draft, num_draft_tokens=knobs["num_draft_tokens"],
                             adaptive=knobs["adaptive"], sampling=sampling, seed=0)
