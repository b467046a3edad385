"""`method.budget=auto`: speculation sized for the hardware by the measured cost model (bench/costmodel.py).

`AutoBudget` wraps any drafter. Each step it verifies only the first k nodes of the drafter's tree (parents come
before children, so the first k nodes are a tree and its accepted path is the full tree's, cut), with k chosen to
maximise predicted tokens/s: (1 + sum of the acceptance rates of nodes 0..k-1) / (t(1 + k + aux) + drafting time),
t from the target's profile at the current context length, the rates counted over this run's verified nodes.
When no k beats plain decoding (1 / t(1)), it stops calling the drafter at all until a probe. Chain drafters are
asked for k tokens only (the engine's `budget` argument), so SpS stops paying for drafts it would cut.

Probes keep the estimates honest: the first `warmup_steps` steps and then a step whenever the probes' extra cost
stays within `probe_share` of the time decoded since verify the whole tree. Lossless throughout: the target
verifies whatever is kept, and a cut tree is still a tree (sibling draws stay prefixes of their draw order).
"""
from __future__ import annotations

import torch

from bench.costmodel import Profile, best_size
from bench.timing import device_time
from bench.tree import DraftTree


def first_nodes(tree: DraftTree, k: int) -> DraftTree:
    """The tree of the first k nodes (and every auxiliary node)."""
    if k >= len(tree):
        return tree
    probs = None if tree.draft_probs is None else tree.draft_probs[:k]
    return DraftTree(tree.tokens[:k], tree.parents[:k], probs, tree.siblings, tree.aux_tokens, tree.aux_depths,
                     tree.aux_mask)


class AutoBudget:
    """A drafter that verifies as much of another drafter's tree as the cost model says pays (see module doc)."""

    def __init__(self, drafter, profile: Profile, device: torch.device, probe_share: float = 0.03,
                 warmup_steps: int = 4, prior: tuple[float, float] = (0.1, 1.0)):
        self.inner, self.profile, self.device = drafter, profile, device
        self.probe_share, self.warmup_steps, self.prior = probe_share, warmup_steps, prior
        self.feature_layers = tuple(getattr(drafter, "feature_layers", ()))
        self.artifact = getattr(drafter, "artifact", None)
        self.hits: list[float] = []  # per node index: times it was verified and accepted
        self.tries: list[float] = []  # per node index: times it was verified
        self.draft_seconds = 0.0  # mean drafting time of the steps that drafted
        self.drafted_steps = self.steps = 0
        self.full_size, self.aux = 1, 0  # the drafter's last full tree: nodes, auxiliary nodes
        self.probe_credit = 0.0  # seconds of probing allowed so far
        self.plans: list[int | None] = []  # per step: nodes planned, None for a probe, -1 when the drafter rested

    def accept_probs(self) -> list[float]:
        a, b = self.prior
        return [(h + a) / (t + b) for h, t in zip(self.hits, self.tries)]

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        if self.feature_layers:
            self.inner.start(prompt_ids, hidden=hidden)
        else:
            self.inner.start(prompt_ids)

    def _plan(self, context_len: int) -> tuple[int | None, bool]:
        """(nodes to verify, None: all; whether to call the drafter) for the next step."""
        probs = self.accept_probs() + [self.prior[0] / self.prior[1]] * max(0, self.full_size - len(self.hits))
        k, rate = best_size(probs[: self.full_size], context_len, self.profile, self.aux, self.draft_seconds)
        plain = self.profile.forward_seconds(1, context_len)
        draft = k > 0 and rate * plain > 1.0  # beats a plain step
        step_seconds = self.profile.forward_seconds(1 + k + self.aux, context_len) + self.draft_seconds if draft else plain
        self.probe_credit += self.probe_share * step_seconds
        probe_cost = (self.draft_seconds + self.profile.forward_seconds(1 + self.full_size + self.aux, context_len)
                      - step_seconds)
        if self.steps < self.warmup_steps or self.probe_credit >= probe_cost:
            if self.steps >= self.warmup_steps:
                self.probe_credit -= probe_cost
            return None, True  # a probe: the whole tree
        return k, draft

    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        k, draft = self._plan(len(context) - 1)  # cached tokens: all but the root
        self.steps += 1
        self.plans.append(k if draft else -1)
        if not draft:
            return None
        start = device_time(self.device)
        tree = self.inner.propose(context, budget if k is None else min(budget, k + 1))
        elapsed = device_time(self.device) - start
        self.drafted_steps += 1
        self.draft_seconds += (elapsed - self.draft_seconds) / self.drafted_steps
        if tree is None:
            return None
        if k is None:  # a probe: the largest tree seen sizes the next plans
            self.full_size, self.aux = max(self.full_size, len(tree)), len(tree.aux_tokens)
            return tree
        return first_nodes(tree, k)

    def update(self, step) -> None:
        tree = step.tree
        if tree is not None and len(tree):
            grow = len(tree) - len(self.tries)
            if grow > 0:
                self.tries += [0.0] * grow
                self.hits += [0.0] * grow
            for node in range(len(tree)):
                self.tries[node] += 1
            for row in step.acceptance.rows[1:]:
                if row <= len(tree):
                    self.hits[row - 1] += 1
        self.inner.update(step)
