"""The batched engine's compiled verification (engine.compile=on at gen.batch_size > 1): bench/engine/compiled.py's
recipe for B rows.

The batch's cache is preallocated (a StaticCache of `rows` x capacity) and laid out as the eager BatchCache lays it
out (bench/engine/batched.py): every step appends L slots to every row, each row's accepted inputs are moved to the
front of them, the other slots stay holes that no query sees, and the holes are compacted away in place once they
build up. A step's inputs are padded to a bucket of L (1, 2, 4, ... 128) and run the graph made for [rows, bucket];
its additive mask is written into that bucket's buffer [rows, 1, bucket, capacity].

The batch keeps its rows: a row whose answer ended (or a spare row of a batch of fewer prompts) stays in it as a
spare row that sees only itself, so one graph per bucket serves the whole run. Drafters run eager in a batch (each
row's drafter is a copy with a cache of its own). Full-attention models only: a windowed one runs eager, said.
"""
from __future__ import annotations

import sys

import torch
from transformers import DynamicCache, StaticCache

from bench.engine.compiled import (
    BUCKETS,
    bucket_of,
    call_compiled,
    capacity_for,
    compile_step,
    frozen,
    unmark_static,
    use_compiled_sdpa,
)
from bench.engine.kvcache import host_to_device, move_kept_rows
from bench.engine.target import features_of
from bench.engine.tree import DraftTree


def compiled_batch(model, feature_layers: tuple[int, ...], windows: dict[str, int | None]):
    """The batched engine's compiled verification, or None (eager) for a model with sliding-window layers (said)."""
    if any(window is not None for window in windows.values()):
        print(f"warning: engine.compile=on: {type(model).__name__} has sliding-window layers, which the compiled "
              f"engine does not handle yet; the batched engine runs eager", file=sys.stderr)
        return None
    return StaticBatchCache(model, feature_layers)


def step_ids(roots: list[int], trees: list[DraftTree | None], length: int, device: torch.device) -> torch.Tensor:
    """[B, L] input ids of a step, each row padded with its root; draft tokens a drafter left on the device
    (DeviceTokens) stay there."""
    if not any(tree is not None and tree.tokens_on_device for tree in trees):
        rows = [[root] if tree is None else [root, *tree.tokens, *tree.aux_tokens] for root, tree in zip(roots, trees)]
        return host_to_device([row + [row[0]] * (length - len(row)) for row in rows], device, torch.long)
    rows = [host_to_device([root], device, torch.long) if tree is None else tree.input_ids(root, device)
            for root, tree in zip(roots, trees)]
    return torch.stack([torch.cat([row, row[:1].expand(length - len(row))]) for row in rows])


class StaticBatchCache:
    """A batch of `rows` sequences over a preallocated cache, verified by compiled forwards (module doc). The engine
    calls reserve, start, then verify, keep_accepted and retire each step, as it calls BatchCache's."""

    def __init__(self, model, feature_layers: tuple[int, ...]):
        self.model, self.feature_layers, self.device = model, feature_layers, model.device
        self.rows, self.capacity, self.cache = 0, 0, None
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # bucket -> ids, positions, mask
        use_compiled_sdpa(model)
        self.forward = compile_step(self._step)
        self.slots, self.lengths, self.valid = 0, [], None

    def _step(self, input_ids, position_ids, attention_mask):
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         cache=self.cache, output_hidden_states=bool(self.feature_layers))
        return out.logits, features_of(out, self.feature_layers)

    def reserve(self, rows: int, positions: int) -> None:
        """Room for `rows` sequences of `positions` tokens each and the steps' slack; a new shape means new graphs,
        so a run reserves its largest batch and longest turn once, before precompile."""
        if rows <= self.rows and positions + 2 * BUCKETS[-1] <= self.capacity:
            return
        if self.capacity:
            print(f"note: engine.compile=on: a batch of {rows} rows and {positions} positions outgrew the cache; its "
                  f"graphs are made again", file=sys.stderr)
        self.rows, self.capacity = max(rows, self.rows), capacity_for(positions + BUCKETS[-1])
        config = self.model.config.get_text_config(decoder=True)
        self.cache = StaticCache(config, max_cache_len=self.capacity)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(self.rows, heads, head_dim, self.model.dtype, self.device)
        unmark_static(self.cache)
        self.buffers.clear()

    def start(self, caches: list[DynamicCache]) -> StaticBatchCache:
        """The batch from its rows' prefilled caches (row b: caches[b]; rows beyond them spare)."""
        self.lengths = [c.get_seq_length() for c in caches] + [0] * (self.rows - len(caches))
        self.slots = max(self.lengths)
        for index, layer in enumerate(self.cache.layers):
            for b, cache in enumerate(caches):
                layer.keys[b, :, : self.lengths[b]] = cache.layers[index].keys[0]
                layer.values[b, :, : self.lengths[b]] = cache.layers[index].values[0]
            layer.cumulative_length.fill_(self.slots)
        lengths = host_to_device(self.lengths, self.device, torch.long)
        self.valid = torch.arange(self.capacity, device=self.device)[None, :] < lengths[:, None]  # [rows, capacity]
        return self

    def _buffers(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if bucket not in self.buffers:
            dtype = self.model.dtype
            self.buffers[bucket] = (torch.zeros(self.rows, bucket, dtype=torch.long, device=self.device),
                                    torch.zeros(self.rows, bucket, dtype=torch.long, device=self.device),
                                    torch.empty(self.rows, 1, bucket, self.capacity, dtype=dtype, device=self.device))
        return self.buffers[bucket]

    def verify(self, roots: list[int], trees: list[DraftTree | None],
               bucket: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One compiled forward over every row's root and tree, padded to `bucket` (None: the smallest that fits):
        logits [rows, L, vocab] and features [rows, L, F] (or None), L the longest row's inputs."""
        sizes = [1 if tree is None else 1 + len(tree) + len(tree.aux_tokens) for tree in trees]
        length, past = max(sizes), self.slots
        bucket = bucket or bucket_of(length)
        if past + bucket > self.capacity:
            raise ValueError(f"a step of {bucket} inputs after {past} slots in a batch cache of {self.capacity}")
        input_ids, positions, mask = self._buffers(bucket)
        offsets = torch.zeros(self.rows, bucket, dtype=torch.long)  # padding inputs: the root's position
        local = torch.eye(bucket, dtype=torch.bool).repeat(self.rows, 1, 1)  # [rows, bucket, bucket]: sees itself
        for b, (tree, size) in enumerate(zip(trees, sizes)):
            if tree is not None:
                offsets[b, :size] = tree.position_offsets
                local[b, :size, :size] = tree.local_mask
        input_ids.copy_(step_ids(roots, trees, bucket, self.device))
        lengths = host_to_device(self.lengths, self.device, torch.long)
        positions.copy_(lengths[:, None] + host_to_device(offsets, self.device))
        mask.fill_(torch.finfo(mask.dtype).min)
        mask[:, 0, :, :past].masked_fill_(self.valid[:, None, :past], 0)
        mask[:, 0, :, past : past + bucket].masked_fill_(host_to_device(local, self.device), 0)
        freeze = frozen(self.rows * bucket, self.model.dtype, self.device)
        logits, hidden = call_compiled(self.forward, freeze, past + bucket, input_ids, positions, mask)
        return logits[:, :length], None if hidden is None else hidden[:, :length]

    def keep_accepted(self, kept_rows: list[list[int]]) -> None:
        """After a step's forward: keep, for each row, its inputs at `kept_rows` (root first; [] for a spare row)."""
        past, counts = self.slots, [len(rows) for rows in kept_rows]
        most = max(counts)
        move_kept_rows(self.cache, past, kept_rows)
        counted = host_to_device(counts, self.device, torch.long)
        self.valid[:, past : past + most] = torch.arange(most, device=self.device)[None, :] < counted[:, None]
        self._set_slots(past + most)
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]

    def hold(self, length: int) -> None:
        """Take every row as holding the cache's first `length` positions (the profile times forwards after a
        context this way, whatever those positions hold)."""
        self.lengths = [length] * self.rows
        self.valid.copy_(torch.arange(self.capacity, device=self.device)[None, :] < length)
        self._set_slots(length)

    def _set_slots(self, slots: int) -> None:
        self.slots = slots
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(slots)

    def retire(self, rows: list[int | None], finished: list[int]) -> list[int | None]:
        """After a step: the batch rows `finished` become spare rows; holes are compacted away in place once they
        build up (or the cache runs short of room for the next step). Returns what `rows` becomes."""
        rows = [None if i in finished else b for i, b in enumerate(rows)]
        spare = self.slots - max(self.lengths)
        if spare > max(16, self.slots // 8) or self.slots + 2 * BUCKETS[-1] > self.capacity:
            self.compact()
        return rows

    def compact(self) -> None:
        """Every row's tokens moved to its first slots, in order."""
        total, past = max(self.lengths), self.slots
        order = torch.argsort((~self.valid[:, :past]).to(torch.int8), dim=1, stable=True)[:, :total]
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values):
                tensor[:, :, :total] = tensor[:, :, :past].gather(
                    2, order[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3]))
        lengths = host_to_device(self.lengths, self.device, torch.long)
        self.valid.copy_(torch.arange(self.capacity, device=self.device)[None, :] < lengths[:, None])
        self._set_slots(total)

    @torch.inference_mode()
    def precompile(self, largest: int) -> None:
        """Make the graph of every bucket up to the one of `largest` inputs now (a dummy step of each size over an
        empty batch), so none is made while timed."""
        for bucket in BUCKETS[: BUCKETS.index(bucket_of(largest)) + 1]:
            self.start([])
            self.verify([0] * self.rows, [None] * self.rows, bucket)
