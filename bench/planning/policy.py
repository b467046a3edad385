"""`method.sizing=auto`: speculation sized for the hardware by the measured cost model (bench/planning/costmodel.py).

At batch 1, `PlannedDrafter` wraps any drafter. Each step it verifies only the first k nodes of the drafter's tree
(parents come before children, so the first k nodes are a tree and its accepted path is the full tree's, cut), with
k chosen to maximise predicted tokens/s: (1 + sum of the acceptance rates of nodes 0..k-1) / (t(1 + k + aux) +
drafting time), t from the target's profile at the current context length (its tree points when the drafter's
trees are not chains, or when every step passes a tree mask, as batched ones do), the rates counted over this run's
verified nodes.
When no k beats plain decoding (1 / t(1)), it stops calling the drafter at all until a probe. Chain drafters are
asked for k tokens only (propose's `max_tokens` argument), so SpS stops paying for drafts it would cut, and every
drafter for its first k nodes (`propose_first`): EAGLE-2 and EAGLE-3 then draft only the levels those need, Medusa
and Hydra only the heads. Such drafters declare it (`partial_drafts`, SpS too), and their drafting time is priced
per size asked (the mean measured for each, linear between them) instead of one mean for every k, so that where
verification is nearly free (bfloat16) a smaller tree can win by its drafting alone.

Probes keep the estimates honest: the first `warmup_steps` steps and then a step whenever the probes' extra cost
stays within `probe_share` of the time decoded since verify the whole tree. Lossless throughout: the target
verifies whatever is kept, and a cut tree is still a tree (sibling draws stay prefixes of their draw order).

The decisions live in `SpeculationPlanner`, which the batched engine (bench/engine/batched.py, gen.batch_size > 1) asks
too, with the profile measured at its batch size: there a row's expected gain is scaled by the share of rows that
returned a draft (the forward is as wide for all), each row's drafter is asked for the k nodes planned (its first k
with partial drafts), and once the rows have drafted, `cut` picks the k that pays for the drafts actually
returned.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.engine.drafter import Drafter, start_drafter
from bench.engine.timing import device_time
from bench.engine.tree import DraftTree
from bench.planning.costmodel import Profile, best_size


class SpeculationPlanner:
    """How many draft nodes the next step should verify (see module doc): the run's per-node acceptance counts, the
    drafting time per step and the profile of the target's forward at the batch size being decoded. Under
    method.sizing=auto the batch-1 wrapper `PlannedDrafter` and the batched engine (bench/engine/batched.py) ask it."""

    def __init__(self, profile: Profile, probe_share: float = 0.03, warmup_steps: int = 4,
                 prior: tuple[float, float] = (0.1, 1.0), masked_steps: bool = False, partial_drafts: bool = False):
        self.profile, self.probe_share, self.warmup_steps, self.prior = profile, probe_share, warmup_steps, prior
        self.masked_steps = masked_steps  # every step's forward takes a tree mask (the batched engine's do)
        self.partial_drafts = partial_drafts  # the drafter drafts only the nodes asked for: drafting priced per size
        self.size_draft_seconds: dict[int, tuple[float, int]] = {}  # nodes asked -> (mean drafting seconds, steps)
        self.trees_drafted = False  # the drafter's last full tree was not a chain: its steps take a tree mask
        self.hits: list[float] = []  # per node index: times it was verified and accepted
        self.tries: list[float] = []  # per node index: times it was verified
        self.draft_seconds = 0.0  # mean drafting time of the steps that drafted
        self.drafted_steps = self.steps = 0
        self.full_size, self.aux = 1, 0  # the drafter's last full tree: nodes, auxiliary nodes
        self.probe_credit = 0.0  # seconds of probing allowed so far
        self.plans: list[int | None] = []  # per step: nodes planned, None for a probe, -1 when the drafter rested
        self.proposals = self.trees = 0  # batched: rows asked for a draft, rows that returned one

    def accept_probs(self) -> list[float]:
        a, b = self.prior
        return [(h + a) / (t + b) for h, t in zip(self.hits, self.tries)]

    def _probs(self, size: int) -> list[float]:
        """Acceptance estimates of nodes 0..size-1 (the prior where none was verified yet)."""
        return (self.accept_probs() + [self.prior[0] / self.prior[1]] * size)[:size]

    def plan(self, context_len: int, rows: int = 1) -> tuple[int | None, bool]:
        """(nodes to verify, None: the whole tree (a probe); whether to call the drafter) for the next step, whose
        forward attends `context_len` cached tokens. With `rows` > 1 (a batch sharing one forward) a row's expected
        gain is scaled by the share of rows whose drafter returned a draft so far: the forward is as long for all."""
        probs = self._probs(self.full_size)
        if rows > 1:
            share = (self.trees + 1) / (self.proposals + 1)
            probs = [q * share for q in probs]
        drafting = self.drafting_seconds()
        k, rate = best_size(probs, context_len, self.profile, self.aux, drafting, self._tree)
        plain = self.profile.forward_seconds(1, context_len, self.masked_steps)
        draft = k > 0 and rate * plain > 1.0  # beats a plain step
        step_seconds = self._forward(1 + k + self.aux, context_len) + drafting[k] if draft else plain
        self.probe_credit += self.probe_share * step_seconds
        probe_cost = drafting[-1] + self._forward(1 + self.full_size + self.aux, context_len) - step_seconds
        self.steps += 1
        if self.steps <= self.warmup_steps or self.probe_credit >= probe_cost:
            if self.steps > self.warmup_steps:
                self.probe_credit -= probe_cost
            k, draft = None, True  # a probe: the whole tree
        self.plans.append(k if draft else -1)
        return k, draft

    def drafting_seconds(self) -> list[float]:
        """Drafting seconds of a step that verifies k = 0 .. full_size nodes: the mean of every drafted step for any
        k, or, for a drafter with partial drafts, the means measured per size asked (probes: the whole tree's),
        linear between measured sizes and the nearest one's outside them."""
        if not (self.partial_drafts and self.size_draft_seconds):
            return [self.draft_seconds] * (self.full_size + 1)
        sizes = sorted(self.size_draft_seconds)
        means = [self.size_draft_seconds[size][0] for size in sizes]
        return [float(np.interp(k, sizes, means)) for k in range(self.full_size + 1)]

    @property
    def _tree(self) -> bool:
        return self.masked_steps or self.trees_drafted

    def _forward(self, length: int, context_len: int) -> float:
        """t(length, context) of a drafted step: a tree point when its forward takes a tree mask."""
        return self.profile.forward_seconds(length, context_len, self._tree)

    def cut(self, trees: list[DraftTree | None], context_len: int) -> int:
        """Batched, after drafting: k such that verifying the first k nodes of every row's tree maximises this step's
        predicted tokens/s, given how much each row drafted (rows without a draft gain nothing, yet the forward is
        as long for them); 0: verify no draft at all."""
        sizes = [0 if t is None else len(t) for t in trees]
        aux = max((len(t.aux_tokens) for t in trees if t is not None), default=0)
        cumulative = [0.0]
        for q in self._probs(max(sizes)):
            cumulative.append(cumulative[-1] + q)
        plain = self.profile.forward_seconds(1, context_len, self.masked_steps)
        rows, best, best_rate = len(trees), 0, len(trees) / (plain + self.draft_seconds)
        for k in range(1, max(sizes) + 1):
            gain = sum(cumulative[min(k, size)] for size in sizes)
            rate = (rows + gain) / (self._forward(1 + k + aux, context_len) + self.draft_seconds)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def drafted(self, seconds: float, full_trees: list[DraftTree] = (), rows: int = 1, trees: int = 1,
                nodes: int | None = None) -> None:
        """A step's drafting time; on a probe, its whole trees (the largest sizes the next plans); batched, how many
        rows were asked for a draft and how many returned one; `nodes`: the nodes the drafter was asked for (None:
        the whole tree)."""
        self.proposals += rows
        self.trees += trees
        self.drafted_steps += 1
        self.draft_seconds += (seconds - self.draft_seconds) / self.drafted_steps
        for tree in full_trees:
            self.full_size, self.aux = max(self.full_size, len(tree)), len(tree.aux_tokens)
            self.trees_drafted = not tree.is_chain
        size = self.full_size if nodes is None else nodes
        mean, steps = self.size_draft_seconds.get(size, (0.0, 0))
        self.size_draft_seconds[size] = (mean + (seconds - mean) / (steps + 1), steps + 1)

    def observe(self, tree: DraftTree | None, accepted_rows: list[int]) -> None:
        """Count which nodes of a verified tree were accepted (rows: the kept path's input rows, root first)."""
        if tree is None or not len(tree):
            return
        grow = len(tree) - len(self.tries)
        if grow > 0:
            self.tries += [0.0] * grow
            self.hits += [0.0] * grow
        for node in range(len(tree)):
            self.tries[node] += 1
        for row in accepted_rows[1:]:
            if row <= len(tree):
                self.hits[row - 1] += 1


class PlannedDrafter(Drafter):
    """A drafter that verifies as much of another drafter's tree as the planner says pays (see module doc)."""

    def __init__(self, drafter, profile: Profile, device: torch.device, probe_share: float = 0.03,
                 warmup_steps: int = 4, prior: tuple[float, float] = (0.1, 1.0), clock=None):
        self.inner, self.device, self.clock = drafter, device, clock  # clock: for drafting seconds (tests fake it)
        self.planner = SpeculationPlanner(profile, probe_share, warmup_steps, prior,
                                          partial_drafts=drafter.partial_drafts)
        self.feature_layers, self.samples, self.artifact = drafter.feature_layers, drafter.samples, drafter.artifact
        # warmed up and rewound as the drafter is
        self.learns_across_prompts, self.learns_in_warm_up = drafter.learns_across_prompts, drafter.learns_in_warm_up

    def most_nodes(self) -> int | None:
        return self.inner.most_nodes()  # a plan only cuts the tree

    def reserve(self, positions: int) -> None:
        self.inner.reserve(positions)

    def precompile(self) -> None:
        self.inner.precompile()

    def learned_state(self):
        return self.inner.learned_state()

    def restore_learned_state(self, state) -> None:
        self.inner.restore_learned_state(state)

    @property
    def plans(self) -> list[int | None]:
        return self.planner.plans

    @property
    def warmup_steps(self) -> int:
        return self.planner.warmup_steps

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None, seed: int | None = None) -> None:
        start_drafter(self.inner, prompt_ids, hidden, seed)

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        k, draft = self.planner.plan(len(context) - 1)  # cached tokens: all but the root
        if not draft:
            return None
        start = device_time(self.device, self.clock)
        if k is None:
            tree = self.inner.propose(context, max_tokens)
        else:
            tree = self.inner.propose_first(context, min(max_tokens, k + 1), k)
        seconds = device_time(self.device, self.clock) - start
        self.planner.drafted(seconds, [tree] if k is None and tree is not None else [], nodes=k)
        return tree

    def update(self, step) -> None:
        self.planner.observe(step.tree, step.acceptance.rows)
        self.inner.update(step)
