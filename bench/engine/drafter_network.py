"""A drafter's network (an EAGLE head, a draft model) over a KV cache of its own, the same calls either way:
`EagerForward` over a DynamicCache (any engine), `StaticForward` compiled over a preallocated cache as the compiled
target runs (engine.compile=on; bench/engine/compiled.py's recipe).

`forward(cache=, position_ids=, attention_mask=, **rows)` is the network's call, returning a tensor [1, rows, ...];
every row input is [1, rows, ...]. A call feeds T rows after the `length` cached ones, at `position_ids` (None: the
next T positions) under an additive `mask` [T, length + T] (None: causal); `cut_to` drops cached positions again.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import StaticCache

from bench.engine.compiled import (
    BUCKETS,
    bucket_of,
    call_compiled,
    capacity_for,
    causal_block,
    compile_step,
    frozen,
    unmark_static,
    use_compiled_sdpa,
)
from bench.engine.kvcache import new_cache


class EagerForward:
    """The network's eager forward over a DynamicCache."""

    compiled = False

    def __init__(self, forward: Callable):
        self.forward = forward
        self.cache = new_cache()

    def for_new_turn(self) -> EagerForward:
        """An empty one of its own (a drafter copied per batch row gives each copy its cache)."""
        return EagerForward(self.forward)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def cut_to(self, length: int) -> None:
        surplus = self.length - length
        if surplus > 0:
            self.cache.crop(-surplus)

    def __call__(self, rows: dict[str, torch.Tensor], position_ids: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, **options) -> torch.Tensor:
        """`options` go to the network's call (logits_to_keep: what a padded graph cannot take)."""
        return self.forward(cache=self.cache, position_ids=position_ids,
                            attention_mask=None if mask is None else mask[None, None], **rows, **options)


class StaticForward:
    """The network compiled per bucket of rows over a StaticCache of `config`'s layers, reserved for a turn. A call's
    dummy rows are dropped from `length` again; calls of more rows than the graphs made by `precompile` (the prompt's,
    as the target's prefill) and calls with options other than logits_to_keep run eager over the same cache."""

    compiled = True

    def __init__(self, forward: Callable, config, module: torch.nn.Module):
        self.forward_eager, self.config = forward, config
        self.device, self.dtype = next(module.parameters()).device, next(module.parameters()).dtype
        use_compiled_sdpa(module)
        self.forward_compiled = compile_step(forward)
        self.cache, self.capacity, self.length, self.largest = None, 0, 0, 0
        self.buffers: dict[tuple, torch.Tensor] = {}  # (name, bucket, trailing shape, dtype) -> [1, bucket, ...]
        self.masks: dict[int, torch.Tensor] = {}  # bucket -> [1, 1, bucket, capacity] additive

    def reserve(self, positions: int) -> None:
        """A cache of at least `positions` (a new size: new graphs); emptied."""
        if positions + BUCKETS[-1] > self.capacity:
            self.capacity = capacity_for(positions)
            self.cache = StaticCache(self.config, max_cache_len=self.capacity)
            config = self.config
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            self.cache.early_initialization(1, heads, head_dim, self.dtype, self.device)
            unmark_static(self.cache)
            self.buffers.clear()
            self.masks.clear()
        self.reset()

    def reset(self) -> None:
        self.cut_to(0)

    def for_new_turn(self) -> StaticForward:
        """Itself, emptied (the compiled engine decodes one turn at a time)."""
        self.reset()
        return self

    def cut_to(self, length: int) -> None:
        self.length = length
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)

    def precompile(self, rows: dict[str, torch.Tensor], largest: int) -> None:
        """Make the graphs of every bucket up to the one of `largest` rows for inputs shaped like `rows` (each
        [1, 1, ...]), from an empty cache; later calls of more rows run eager."""
        self.largest = max(self.largest, bucket_of(largest))
        for bucket in BUCKETS[:BUCKETS.index(bucket_of(largest)) + 1]:
            self.cut_to(0)
            self({name: value.expand(1, bucket, *value.shape[2:]) for name, value in rows.items()})
        self.cut_to(0)

    def _buffer(self, name: str, value: torch.Tensor, bucket: int) -> torch.Tensor:
        key = (name, bucket, tuple(value.shape[2:]), value.dtype)
        if key not in self.buffers:
            self.buffers[key] = value.new_zeros(1, bucket, *value.shape[2:])
        return self.buffers[key]

    def _mask(self, bucket: int, eager: bool) -> torch.Tensor:
        """An additive mask [1, 1, bucket, capacity] that sees nothing: the bucket's buffer, or a new one (eager)."""
        shape, nothing = (1, 1, bucket, self.capacity), torch.finfo(self.dtype).min
        if eager:
            return torch.full(shape, nothing, dtype=self.dtype, device=self.device)
        if bucket not in self.masks:
            self.masks[bucket] = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self.masks[bucket].fill_(nothing)

    def __call__(self, rows: dict[str, torch.Tensor], position_ids: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, **options) -> torch.Tensor:
        """The network's output [1, T, ...] for the T rows after the cached ones: at `position_ids` [1, T] (None: the
        next T positions) under the additive `mask` [T, length + T] (None: causal, every row sees the past). Other
        `options` for the network run it eager; `logits_to_keep=n` (the last n rows' output) a graph takes by
        computing every row's, sliced after it."""
        past, count = self.length, next(iter(rows.values())).shape[1]
        if past + count + BUCKETS[-1] > self.capacity:
            raise ValueError(f"{past + count} positions in a cache reserved for {self.capacity - BUCKETS[-1]}")
        eager = count > self.largest or bool(set(options) - {"logits_to_keep"})
        bucket = count if eager else bucket_of(count)
        full = self._mask(bucket, eager)
        block = full[0, 0]
        if mask is None:
            causal_block(block[:count], past, count)
        else:
            block[:count, :past + count] = mask
        block[:, past:past + bucket].diagonal().fill_(0)  # every row sees itself (dummy rows only themselves)
        positions = torch.arange(past, past + count, device=self.device)[None] if position_ids is None else \
            position_ids
        if eager:
            out = self.forward_eager(cache=self.cache, position_ids=positions, attention_mask=full, **rows, **options)
        else:
            padded = {}
            for name, value in rows.items():
                padded[name] = self._buffer(name, value, bucket)
                padded[name][:, :count] = value
            position_buffer = self._buffer("position_ids", positions, bucket)
            position_buffer[:, :count] = positions
            position_buffer[:, count:] = past
            freeze = frozen(bucket, self.dtype, self.device)
            out = call_compiled(self.forward_compiled, freeze, past + bucket, cache=self.cache,
                                position_ids=position_buffer, attention_mask=full, **padded)
            out = out[:, :count][:, count - options.get("logits_to_keep", count):]
        self.cut_to(past + count)
        return out
