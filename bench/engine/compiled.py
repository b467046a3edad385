"""Compiled forwards over a preallocated cache, the compiled engine's recipe (gpt-fast's, generalised to trees), for
the target (target.py's CompiledTarget) and for the networks drafters run (bench/engine/drafter_network.py's
StaticForward).

A forward of T input rows is padded to a bucket of 1, 2, 4, ... 128 rows (dummy rows that see only themselves and
that nothing sees) and runs the graph `torch.compile` made for that bucket, with the step's additive mask written
into a buffer of the bucket's own [1, 1, bucket, capacity]. Attention reads only the filled part of the cache
(`filled_sdpa`, opaque to the compiler, so one graph serves every length). A graph of float32 weights from
PACKED_FROM rows on, and every graph of 16-bit weights, is made on the CPU with the weights frozen into it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # input rows of a compiled forward
ATTENTION = "specbench_sdpa"  # the compiled engine's attention (compiled_sdpa), registered with transformers
# From this many rows a float32 graph is made with the weights frozen into it (inductor's freezing: on CPU in float32
# MKL's GEMM over weights packed once for the graph's size, one more copy of them per such graph). MKL otherwise packs
# them at every small GEMM: SmolLM2's float32 step of 4 and 8 inputs took 45 and 50 ms frozen, 56 and 64 ms not; of 1
# and 2 inputs, unpacked weights are faster (29.0 against 29.8 ms for one input, 2026-12-06). 16-bit weights are
# frozen at every size (oneDNN's packed bfloat16 GEMM): SmolLM2's bfloat16 step of one input took 25.1 ms frozen,
# 30.5 ms not (AMX, 2026-12-06). All measured alone on 2 Xeon cores; logs in issue 56's closing notes.
PACKED_FROM = 4
CAPACITY_STEP = 256  # cache positions, rounded up to a multiple of this (a new capacity: new graphs)


def bucket_of(size: int) -> int:
    for bucket in BUCKETS:
        if size <= bucket:
            return bucket
    raise ValueError(f"a compiled forward of {size} inputs: the compiled engine runs at most {BUCKETS[-1]}")


def capacity_for(positions: int) -> int:
    """Cache positions for `positions` and a bucket's slack, rounded up to CAPACITY_STEP."""
    return -(-(positions + BUCKETS[-1]) // CAPACITY_STEP) * CAPACITY_STEP


class StepSpan:
    """How many cache positions the running compiled forward attends to: the past and the forward's padded rows. Set
    before each compiled call and read by `filled_sdpa` when it runs (as vLLM's attention reads its forward
    context), so one graph serves every length."""

    positions = 0


@torch.library.custom_op("specbench::filled_sdpa", mutates_args=())
def filled_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                scale: float) -> torch.Tensor:
    """SDPA of `query` [B, H, q, D] over the first StepSpan.positions of the cache's `key` and `value`
    [B, Hkv, capacity, D] (grouped-query attention inside SDPA) under `mask` [B, 1, q, capacity] cut to the same
    span; out [B, q, H, D]. Opaque to the compiler."""
    span = StepSpan.positions
    attn_mask = None if mask is None else mask[..., :span]
    out = torch.nn.functional.scaled_dot_product_attention(query, key[:, :, :span], value[:, :, :span],
                                                           attn_mask=attn_mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


@filled_sdpa.register_fake
def _(query, key, value, mask, scale):
    batch, heads, length, dim = query.shape
    return query.new_empty(batch, length, heads, dim)


def compiled_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                  **kwargs):
    """transformers' SDPA attention, except in a compiled step: there `filled_sdpa` attends to the filled part of the
    cache only, with grouped-query attention inside SDPA. (Over the whole buffer a step cost 4 of 33 ms at 768
    positions; and transformers repeats the cached keys and values once per query head whenever a mask is passed,
    which copied the whole cache in every layer and step: 8 of 45 ms.)"""
    if not torch.compiler.is_compiling():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return filled_sdpa(query, key, value, attention_mask, scale), None


def use_compiled_sdpa(module: torch.nn.Module) -> None:
    """Route the SDPA attention of `module` (a model, or a head whose layers carry transformers configs) through
    compiled_sdpa, the same as SDPA outside compiled steps."""
    AttentionInterface.register(ATTENTION, compiled_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    configs = {id(c): c for c in (getattr(m, "config", None) for m in module.modules()) if c is not None}
    for config in configs.values():
        if getattr(config, "_attn_implementation", None) in ("sdpa", ATTENTION):
            config._attn_implementation = ATTENTION


def compile_step(function: Callable) -> Callable:
    """torch.compile for fixed shapes (one graph per bucket). The weights do not change during a run: no guard checks
    each built-in layer before every step (measured: 2 to 6 ms a step); the networks' own classes keep theirs, so a
    graph is never reused for another network. A graph per bucket and network: never fall back to eager."""
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = dynamo.accumulated_recompile_limit = max(dynamo.recompile_limit, 4096)
    skip = torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe
    return torch.compile(function, dynamic=False, options={"guard_filter_fn": skip})


def frozen(rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a graph of `rows` input rows over weights of `dtype` on `device` is made with the weights frozen into
    it: on the CPU only, where freezing packs them for its GEMMs (on a GPU there is nothing to pack, it was never
    measured there, and a frozen graph per bucket may keep a copy of the weights of its own)."""
    return torch.device(device).type == "cpu" and (rows >= PACKED_FROM or dtype in (torch.bfloat16, torch.float16))


def call_compiled(step: Callable, freeze: bool, span: int, *args, **kwargs):
    """`step` (made by compile_step) over `span` cache positions, its graph made with the weights frozen into it
    where `freeze` (`frozen`)."""
    StepSpan.positions = span
    # dynamo reads the flag from the global config while it traces, not from torch.compile's options
    with torch._inductor.config.patch(freezing=freeze):
        return step(*args, **kwargs)


def unmark_static(cache: StaticCache) -> None:
    """transformers marks a StaticCache's tensors as static addresses, which a frozen graph keeps as its own (another
    network's graph of that size then read and wrote the first one's cache): the cache stays a graph input."""
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values, layer.cumulative_length):
            tensor.__dict__.pop("_dynamo_static_input_type", None)


def causal_block(mask: torch.Tensor, past: int, rows: int) -> None:
    """Let `rows` rows after `past` cached positions see the past and the rows up to themselves, in the additive
    `mask` [rows, >= past + rows] (0: sees it)."""
    mask[:, :past] = 0
    mask[:, past:past + rows].masked_fill_(torch.ones(rows, rows, dtype=torch.bool, device=mask.device).tril(), 0)
