"""Batched draft-then-verify: B sequences decoded together, every sequence's tree verified in one target forward.

The steps are the batch-1 engine's (bench/engine/loop.py), row by row:
  1. prefill each prompt on its own (batch-1 arithmetic: each row's first token is its batch-1 one) and stack the
     caches into one batch cache;
  2. each row's own drafter (`fork_drafter`: a copy of the method's drafter, started with its own row's drafter
     seed, see bench/engine/loop.py's Drafter) proposes a tree under its root;
  3. one target forward over [B, L] inputs (each row's root, nodes and aux nodes, padded to the longest row) with a
     4-D mask [B, 1, L, T + L] and each row's own positions;
  4. each row accepts its own path (one device-to-host copy for the whole batch: greedy decoding's argmax, or
     under sampling the probabilities of every row's tree);
  5. each row keeps its accepted tokens in the cache; rows that finish leave the batch.

Cache layout (`BatchCache`): one DynamicCache [B, heads, T, dim]. Row b's tokens sit in the slots where `valid[b]`
is True, in order, at positions 0..n_b - 1 (`slot_pos[b]`); the other slots are holes (prompt padding, a row's
share of a step it did not fill) that no query attends to. A step appends L slots to every row; afterwards each
row's accepted inputs are moved to the front of those L slots (a gather over the step's slots only, as batch 1's
`keep_accepted_kv` does) and the step's slots are cut to the most any row accepted. Holes are masked, not removed,
so vanilla's batched step copies nothing; when a row leaves, or the slots behind the longest row outgrow
`max(16, T / 8)`, the cache is compacted in one gather. `compile=True` (engine.compile=on) verifies over a
preallocated cache of the same layout instead, one compiled graph per bucket of L (bench/engine/batched_compiled.py:
its rows stay in the batch, a finished one as a spare row).

`planner` (method.sizing=auto): a SpeculationPlanner (bench/planning/policy.py) holding the target's profile at this
batch size decides each step how many nodes every row verifies, and rests the drafters when speculation would lose
to a plain batched step at the current context length and acceptance. Its probes (whole trees, to keep the
acceptance estimates current) get BATCH_PROBE_SHARE of the decode time, a third of batch 1's: a batched probe
drafts for every row and widens every row's forward.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache

from bench.engine.acceptance import Acceptance, greedy_path, host_with_drafts, probs_on_host, sampling_path
from bench.engine.batched_compiled import compiled_batch, step_ids
from bench.engine.drafter import Drafter, StepResult, drafter_seed, start_drafter
from bench.engine.kvcache import additive_masks, attention_windows, host_to_device, move_kept_rows, new_cache
from bench.engine.loop import StopCondition, TurnOutput, open_turn, record_step, target_forward
from bench.engine.sampling import SamplingConfig, greedy_tokens, pick_token
from bench.engine.timing import Clock, PhaseTimer, device_time
from bench.engine.tree import DraftTree, first_nodes, real_tree

BATCH_PROBE_SHARE = 0.01  # of decode time spent on probes under method.sizing=auto (batch 1: 0.03)


class StepPlanner(Protocol):
    """What the batched engine asks of a speculation planner (bench/planning/policy.py's SpeculationPlanner)."""

    masked_steps: bool

    def plan(self, context_len: int, rows: int = 1) -> tuple[int | None, bool]: ...

    def drafted(self, seconds: float, full_trees: list[DraftTree] = (), rows: int = 1, trees: int = 1) -> None: ...

    def cut(self, trees: list[DraftTree | None], context_len: int) -> int: ...

    def observe(self, tree: DraftTree | None, accepted_rows: list[int]) -> None: ...


@dataclass
class BatchOutput:
    turns: list[TurnOutput]  # per prompt, in the order given
    finish_seconds: list[float]  # per prompt: seconds from the batch's start until its last token
    phase_seconds: dict[str, float]  # the whole batch's seconds per engine phase


def fork_drafter(drafter):
    """A drafter for one more sequence: a shallow copy that shares the weights, tables and datastores; a drafter's
    per-sequence state (its random generator included) is (re)assigned by its start(), so copies never share it."""
    return copy.copy(drafter)


class BatchCache:
    """The batch's KV cache and where each row's tokens lie in it (see the module doc)."""

    def __init__(self, caches: list[DynamicCache], forward: Callable, windows: dict, dtype: torch.dtype,
                 device: torch.device):
        self.forward, self.windows, self.dtype = forward, windows, dtype  # forward: the engine's target_forward
        self.lengths = [c.get_seq_length() for c in caches]  # n_b: row b's tokens, also its next position
        total = max(self.lengths)
        self.cache = DynamicCache()
        for index, layers in enumerate(zip(*(c.layers for c in caches))):
            keys = torch.stack([_pad_slots(layer.keys[0], total) for layer in layers])  # [B, heads, T, dim]
            values = torch.stack([_pad_slots(layer.values[0], total) for layer in layers])
            self.cache.update(keys, values, index)
        slots = torch.arange(total, device=device)
        self.valid = slots[None, :] < torch.tensor(self.lengths, device=device)[:, None]  # [B, T]
        self.slot_pos = slots.expand(len(caches), total).clone()  # [B, T] position of each slot's token
        self.device = device

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def verify(self, roots: list[int], trees: list[DraftTree | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target forward over every row's root and tree: logits [B, L, vocab] and features [B, L, F] (or None)."""
        return self.forward(**self.step_inputs(roots, trees, self.windows, self.dtype), cache=self.cache)

    def step_inputs(self, roots: list[int], trees: list[DraftTree | None], windows: dict, dtype) -> dict:
        """input_ids [B, L], position_ids [B, L] and the additive 4-D mask [B, 1, L, T + L] of one step."""
        sizes = [1 if tree is None else 1 + len(tree) + len(tree.aux_tokens) for tree in trees]
        batch, length, past = len(trees), max(sizes), self.slots
        ids = step_ids(roots, trees, length, self.device)
        offsets = torch.zeros(batch, length, dtype=torch.long)  # padding inputs: the root's position, seeing itself
        local = torch.eye(length, dtype=torch.bool).repeat(batch, 1, 1)  # [B, L, L]
        for b, (tree, size) in enumerate(zip(trees, sizes)):
            if tree is not None:
                offsets[b, :size] = tree.position_offsets
                local[b, :size, :size] = tree.local_mask
        lengths = host_to_device(self.lengths, self.device, torch.long)
        positions = lengths[:, None] + host_to_device(offsets, self.device)  # [B, L]
        visible = torch.cat([self.valid[:, None, :].expand(batch, length, past), host_to_device(local, self.device)],
                            dim=-1)
        key_positions = torch.cat([self.slot_pos, positions], dim=-1)  # [B, T + L]
        mask = additive_masks(visible, positions, key_positions, windows, dtype)
        return {"input_ids": ids, "position_ids": positions, "attention_mask": mask}

    def keep_accepted(self, kept_rows: list[list[int]]) -> None:
        """After a step's forward: keep, for each row, its inputs at `kept_rows` (root first), in that order."""
        past, counts = self.slots, [len(rows) for rows in kept_rows]  # the step's inputs follow slot `past`
        most = max(counts)
        move_kept_rows(self.cache, past, kept_rows)
        surplus = self.cache.get_seq_length() - (past + most)
        if surplus:
            self.cache.crop(-surplus)
        counted = host_to_device(counts, self.device, torch.long)
        steps = torch.arange(most, device=self.device)
        lengths = host_to_device(self.lengths, self.device, torch.long)
        self.valid = torch.cat([self.valid, steps[None, :] < counted[:, None]], dim=1)
        self.slot_pos = torch.cat([self.slot_pos, lengths[:, None] + steps[None, :]], dim=1)
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]

    def retire(self, rows: list[int], finished: list[int]) -> list[int]:
        """After a step: the batch rows `finished` leave (the cache keeps the others, compacted); holes are compacted
        away once they build up. Returns what `rows` (batch row -> prompt) becomes."""
        staying = [i for i in range(len(rows)) if i not in finished]
        if finished and staying:
            self.compact(staying)
        elif self.needs_compaction():
            self.compact(list(range(len(rows))))
        return [rows[i] for i in staying]

    def needs_compaction(self) -> bool:
        spare = self.slots - max(self.lengths)
        return spare > max(16, self.slots // 8)

    def compact(self, rows: list[int]) -> None:
        """Keep only batch rows `rows` (in that order), each with its tokens in slots 0..n_b - 1."""
        lengths = [self.lengths[r] for r in rows]
        total = max(lengths)
        picked = host_to_device(rows, self.device, torch.long)
        valid = self.valid[picked]
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :total]  # each row's tokens first
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)[picked]
                setattr(layer, name, tensor.gather(2, order[:, None, :, None].expand(-1, tensor.shape[1], -1,
                                                                                     tensor.shape[3])))
        slots = torch.arange(total, device=self.device)
        self.valid = slots[None, :] < host_to_device(lengths, self.device, torch.long)[:, None]
        self.slot_pos = slots.expand(len(rows), total).clone()
        self.lengths = lengths


def _pad_slots(tensor: torch.Tensor, total: int) -> torch.Tensor:
    """[heads, n, dim] -> [heads, total, dim], zeros after the n slots."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, total - tensor.shape[1]))


class BatchedEngine:
    """Draft-then-verify decoding of several prompts at once with any Hugging Face causal LM (see module doc)."""

    def __init__(self, model, drafter: Drafter | None = None, sampling: SamplingConfig = SamplingConfig(),
                 planner: StepPlanner | None = None, clock: Clock | None = None, event=None, compile: bool = False):
        self.model, self.drafter, self.sampling, self.planner = model, drafter, sampling, planner
        self.clock, self.event = clock, event  # the phase timer's (bench/engine/loop.py PhaseTimer); tests inject fakes
        if planner is not None:
            planner.masked_steps = True  # a batched step always passes its 4-D mask: tree points of the profile
        self.device = model.device
        self._windows = attention_windows(model)
        self.feature_layers = () if drafter is None else tuple(drafter.feature_layers)
        # engine.compile=on: verification forwards compiled over a preallocated batch cache (batched_compiled.py)
        self.compiled = compiled_batch(model, self.feature_layers, self._windows) if compile else None

    def _forward(self, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        return target_forward(self.model, self.feature_layers, **inputs)

    def _batch_state(self, caches: list[DynamicCache], prompts: list[list[int]], stop: StopCondition):
        """The decode steps' cache, from the rows' prefilled caches: eager (BatchCache), or the compiled batch's
        preallocated one, reserved for this call's longest prompt and answer."""
        if self.compiled is None:
            return BatchCache(caches, self._forward, self._windows, self.model.dtype, self.device)
        self.compiled.reserve(len(prompts), max(map(len, prompts)) + stop.max_new_tokens)
        return self.compiled.start(caches)

    def _accept(self, logits: torch.Tensor, trees: list, generators: list) -> list[Acceptance]:
        if self.sampling.greedy:
            targets = host_with_drafts(greedy_tokens(logits), trees)  # [B, L]: the one host sync of the step
            return [greedy_path(target, tree) for target, tree in zip(targets, trees)]
        probs = probs_on_host(list(logits), trees, self.sampling)  # one copy for the whole batch
        return [sampling_path(target, draft, tree, generator)
                for (target, draft), tree, generator in zip(probs, trees, generators)]

    def _propose(self, drafters: list, contexts: list[list[int]], max_tokens: list[int]) -> list[DraftTree | None]:
        """Each row's tree; under a planner, none when it rests the drafters, else cut to the size that pays for
        the rows that drafted (a probe keeps whole trees). A drafter with partial drafts drafts only the k nodes
        planned (`propose_first`), as at batch 1."""
        context_len = max(map(len, contexts)) - 1
        k, draft = (None, True) if self.planner is None else self.planner.plan(context_len, len(drafters))
        if self.drafter is None or not draft:
            return [None] * len(drafters)
        start = device_time(self.device, self.clock)
        if k is not None and self.drafter.partial_drafts:
            trees = [d.propose_first(c, min(m, k + 1), k) for d, c, m in zip(drafters, contexts, max_tokens)]
        else:
            trees = [d.propose(c, m if k is None else min(m, k + 1)) for d, c, m in zip(drafters, contexts, max_tokens)]
        trees = [real_tree(t) for t in trees]
        if self.planner is None:
            return trees
        drafted = [t for t in trees if t is not None]
        self.planner.drafted(device_time(self.device, self.clock) - start, drafted if k is None else [], len(trees),
                             len(drafted), nodes=k)
        if k is None or not drafted:
            return trees
        size = self.planner.cut(trees, context_len)
        return [None if t is None or not size else first_nodes(t, size) for t in trees]

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], stop: StopCondition, seeds: list[int | None]) -> BatchOutput:
        """Decode every prompt until `stop`; row b's tokens are what batch-1 decoding of prompts[b] gives."""
        timer = PhaseTimer(self.device, self.clock, self.event)
        generators = [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
        outs: list[TurnOutput] = []
        finish = [None] * len(prompts)  # per row: the timer's mark at its last token
        drafters = [fork_drafter(self.drafter) for _ in prompts] if self.drafter is not None else [None] * len(prompts)
        caches, roots, contexts, active = [], [], [], []
        for b, prompt in enumerate(prompts):  # 1. prefill, one prompt at a time
            caches.append(new_cache())
            logits, hidden = self._forward(input_ids=torch.tensor([prompt], device=self.device), cache=caches[-1],
                                           logits_to_keep=1)
            roots.append(pick_token(logits[0, -1], self.sampling, generators[b]))
            out, context, done = open_turn(prompt, roots[-1], stop)
            outs.append(out)
            contexts.append(context)
            if drafters[b] is not None:
                start_drafter(drafters[b], prompt, None if hidden is None else hidden[0], drafter_seed(seeds[b]))
            if done:
                finish[b] = timer.mark()
            else:
                active.append(b)
        state = self._batch_state([caches[b] for b in active], prompts, stop) if active else None
        del caches
        timer.lap("prefill")
        rows: list[int | None] = [*active, *[None] * (state.rows - len(active))] if active else []  # batch row ->
        while any(b is not None for b in rows):  # its prompt (None: a compiled batch's spare row, decoding nothing)
            live = [i for i, b in enumerate(rows) if b is not None]
            tokens_left = [stop.max_new_tokens - len(outs[rows[i]].tokens) for i in live]
            drafted = self._propose([drafters[rows[i]] for i in live], [contexts[rows[i]] for i in live],
                                    tokens_left)  # 2.
            trees: list[DraftTree | None] = [None] * len(rows)
            for i, tree in zip(live, drafted):
                trees[i] = tree
            sizes = [1 if t is None else 1 + len(t) + len(t.aux_tokens) for t in trees]
            timer.lap("draft")
            logits, hidden = state.verify([0 if b is None else roots[b] for b in rows], trees)  # 3. one forward
            timer.lap("verify")
            acceptances = self._accept(logits if len(live) == len(rows) else logits[live], drafted,
                                       [generators[rows[i]] for i in live])  # 4.
            kept: list[list[int]] = [[] for _ in rows]
            for i, acceptance in zip(live, acceptances):
                kept[i] = acceptance.rows
            state.keep_accepted(kept)  # 5.
            finished = []
            for i, tree, acceptance in zip(live, drafted, acceptances):
                b = rows[i]
                if drafters[b] is not None:
                    rows_hidden = None if hidden is None else hidden[i, : sizes[i]]
                    drafters[b].update(StepResult(tree, logits[i, : sizes[i]], acceptance, rows_hidden))
                if self.planner is not None:
                    self.planner.observe(tree, acceptance.rows)
                roots[b] = acceptance.tokens[-1]
                if record_step(outs[b], contexts[b], stop, acceptance, sizes[i], tree):
                    finish[b] = timer.mark()
                    finished.append(i)
            rows = state.retire(rows, finished)
            timer.lap("accept")
        return BatchOutput(outs, [timer.since_start(mark) for mark in finish], timer.seconds)
