"""The target model as the batch-1 engine runs it: a prefill, verification forwards over a KV cache, and the cache
cut back to the accepted path. Two ways, the same tokens:

- `EagerTarget`: transformers' forward over a DynamicCache (every layer keeps every position; the cache grows and is
  cropped each step). Any model the engine supports.
- `CompiledTarget` (`engine.compile=on`): gpt-fast's recipe generalised to trees. The cache is preallocated for the
  turn (transformers' StaticCache); each verification forward is padded to a bucket of 1, 2, 4, ... 128 inputs
  (dummy nodes that nothing attends to, attending only to themselves) and runs a graph `torch.compile` made for that
  bucket, with the step's additive mask written into a buffer of its own (from PACKED_FROM inputs on, over weights
  frozen into the graph). Attention reads only the filled part of the cache (`filled_sdpa`, outside the graph, so
  one graph serves every length). The accepted rows are copied into place and the cache's length set back, with no
  crop. Full-attention models only (a windowed layer falls back to eager, said in one line).
"""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from bench.engine.kvcache import host_to_device, keep_accepted_kv, new_cache, tree_attention_mask
from bench.engine.tree import DraftTree

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # inputs of a compiled verification forward
ATTENTION = "specbench_sdpa"  # the compiled engine's attention (compiled_sdpa), registered with transformers
# From this many inputs a graph is made with the weights frozen into it (inductor's freezing: on CPU in float32 MKL's
# GEMM over weights packed once for the graph's size, one more copy of them per such graph). MKL otherwise packs them
# at every small GEMM: SmolLM2's float32 step of 4 and 8 inputs took 45 and 50 ms frozen, 56 and 64 ms not; of 1
# and 2 inputs, unpacked weights are faster (measured alone on 2 Xeon cores, logs in issue 56's closing note).
PACKED_FROM = 4
CAPACITY_STEP = 256  # cache positions of a turn, rounded up to a multiple of this (a new capacity: new graphs)


def features_of(out, feature_layers: tuple[int, ...]) -> torch.Tensor | None:
    """The drafter's features [B, L, F] from a forward's hidden states (None when it declares no layers)."""
    if not feature_layers:
        return None
    parts = [out.hidden_states[i] for i in feature_layers]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class EagerTarget:
    """transformers' eager forward over a DynamicCache."""

    compiled = False

    def __init__(self, model, feature_layers: tuple[int, ...], windows: dict[str, int | None]):
        self.model, self.feature_layers, self.windows = model, feature_layers, windows
        self.device = model.device
        self.cache, self.length = None, 0

    def _run(self, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(**inputs, cache=self.cache, output_hidden_states=bool(self.feature_layers))
        hidden = features_of(out, self.feature_layers)
        return out.logits[0], None if hidden is None else hidden[0]

    def prefill(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A fresh cache holding the prompt; the last position's logits [1, vocab] and the prompt's features."""
        self.cache, self.length = new_cache(), len(prompt_ids)
        return self._run(input_ids=torch.tensor([prompt_ids], device=self.device), logits_to_keep=1)

    def verify(self, root: int, tree: DraftTree | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, vocab] (and features [n, F]) of [root, nodes..., aux...]: chains under the model's own causal
        mask, real trees under the tree mask at depth-based positions."""
        if tree is None:
            return self._run(input_ids=host_to_device([[root]], self.device, torch.long))
        inputs = {"input_ids": tree.input_ids(root, self.device)[None]}
        if not tree.is_chain:
            local, offsets = tree.on_device(self.device)
            inputs["attention_mask"] = tree_attention_mask(local, offsets, self.length, self.windows, self.model.dtype)
            inputs["position_ids"] = (offsets + self.length).unsqueeze(0)
        return self._run(**inputs)

    def keep(self, rows: list[int]) -> None:
        """Keep the cached past plus the last step's inputs at `rows`."""
        keep_accepted_kv(self.cache, self.length, rows)
        self.length += len(rows)


def bucket_of(size: int) -> int:
    for bucket in BUCKETS:
        if size <= bucket:
            return bucket
    raise ValueError(f"a verification forward of {size} inputs: the compiled engine verifies at most {BUCKETS[-1]}")


class StepSpan:
    """How many cache positions the running compiled step attends to: the past and the step's padded inputs. Set by
    CompiledTarget before each step and read by `filled_sdpa` when it runs (as vLLM's attention reads its forward
    context), so one graph serves every length."""

    positions = 0


@torch.library.custom_op("specbench::filled_sdpa", mutates_args=())
def filled_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                scale: float) -> torch.Tensor:
    """SDPA of `query` [B, H, q, D] over the first StepSpan.positions of the cache's `key` and `value`
    [B, Hkv, capacity, D] (grouped-query attention inside SDPA) under `mask` [B, 1, q, capacity] cut to the same
    span (none for one query: it sees the whole span); out [B, q, H, D]. Opaque to the compiler."""
    span = StepSpan.positions
    attn_mask = None if query.shape[2] == 1 else mask[..., :span]
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


def use_compiled_sdpa(model) -> None:
    """Route an SDPA model's attention through compiled_sdpa (the same as SDPA outside compiled steps)."""
    if model.config._attn_implementation in ("sdpa", ATTENTION):
        AttentionInterface.register(ATTENTION, compiled_sdpa)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        model.config._attn_implementation = ATTENTION


class CompiledTarget(EagerTarget):
    """Verification forwards compiled per bucket over a preallocated cache (the prefill runs eager over it)."""

    compiled = True

    def __init__(self, model, feature_layers: tuple[int, ...], windows: dict[str, int | None]):
        super().__init__(model, feature_layers, windows)
        self.capacity = 0
        self.masks: dict[int, torch.Tensor] = {}  # bucket -> [1, 1, bucket, capacity] additive mask
        self.positions: dict[int, torch.Tensor] = {}  # bucket -> [1, bucket]
        self.inputs: dict[int, torch.Tensor] = {}  # bucket -> [1, bucket]
        use_compiled_sdpa(model)
        # the weights do not change during a run: no guard checks each built-in layer before every step (measured: 2
        # to 6 ms a step); the model's own classes keep theirs, so a graph is never reused for another model
        skip = torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe
        self.forward = torch.compile(self._step, dynamic=False, options={"guard_filter_fn": skip})
        dynamo = torch._dynamo.config  # a graph per bucket and target (guarded on the target): never fall back to eager
        dynamo.recompile_limit = dynamo.accumulated_recompile_limit = max(dynamo.recompile_limit, 4096)

    def _step(self, input_ids, position_ids, attention_mask):
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         cache=self.cache, output_hidden_states=bool(self.feature_layers))
        return out.logits, features_of(out, self.feature_layers)

    def reserve(self, positions: int) -> None:
        """A cache of at least `positions` (and the bucket's slack), rounded up to CAPACITY_STEP; a new size means
        new graphs, so a run reserves its longest turn once, before precompile."""
        needed = positions + BUCKETS[-1]
        if needed > self.capacity or self.cache is None:
            if self.capacity:
                print(f"note: engine.compile=on: a turn of {positions} positions outgrew the cache; its graphs are "
                      f"made again", file=sys.stderr)
            self.capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
            self.cache = StaticCache(self.model.config, max_cache_len=self.capacity)
            self.masks.clear()

    def prefill(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.reserve(len(prompt_ids) + max_new_tokens)
        self.cache.reset()
        self.length = len(prompt_ids)
        out = self._run(input_ids=torch.tensor([prompt_ids], device=self.device), logits_to_keep=1)
        # the cache is an input of every graph: transformers marks its tensors as static addresses, which a frozen
        # graph keeps as its own (another target's graph of that size then read and wrote the first one's cache)
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                tensor.__dict__.pop("_dynamo_static_input_type", None)
        return out

    @torch.inference_mode()  # as the engine's generate runs: grad mode is one of the graphs' guards
    def precompile(self, prompt_ids: list[int], largest: int = BUCKETS[-1]) -> None:
        """Make the graph of every bucket up to the one of `largest` inputs now (a dummy step of each size after
        `prompt_ids`), so none is made while timed."""
        for bucket in BUCKETS[:BUCKETS.index(bucket_of(largest)) + 1]:
            self.prefill(prompt_ids, 1)
            self._padded_step(None, 0, 1, bucket)

    def _buffers(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if bucket not in self.masks:
            dtype = self.model.dtype
            self.masks[bucket] = torch.full((1, 1, bucket, self.capacity), torch.finfo(dtype).min, dtype=dtype,
                                            device=self.device)
            self.positions[bucket] = torch.zeros(1, bucket, dtype=torch.long, device=self.device)
            self.inputs[bucket] = torch.zeros(1, bucket, dtype=torch.long, device=self.device)
        return self.inputs[bucket], self.positions[bucket], self.masks[bucket]

    def verify(self, root: int, tree: DraftTree | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        size = 1 if tree is None else 1 + len(tree) + len(tree.aux_tokens)
        return self._padded_step(tree, root, size, bucket_of(size))

    def _padded_step(self, tree: DraftTree | None, root: int, size: int, bucket: int):
        """verify's forward of the step's `size` inputs, padded to `bucket`."""
        past = self.length
        input_ids, positions, mask = self._buffers(bucket)
        if tree is None:
            input_ids[0, 0] = root
            positions[0, 0] = past
            local = None
        else:
            input_ids[0, :size] = tree.input_ids(root, self.device)
            local, offsets = tree.on_device(self.device)
            positions[0, :size] = offsets + past
        positions[0, size:] = past  # dummy nodes: any position, nothing attends to them
        mask.fill_(torch.finfo(mask.dtype).min)
        mask[..., :past] = 0
        block = mask[0, 0, :, past:past + bucket]  # [bucket, bucket]: the step's inputs among themselves
        block.fill_diagonal_(0)  # every input sees itself (dummies only themselves)
        if local is not None:
            block[:size, :size].masked_fill_(local, 0)
        StepSpan.positions = past + bucket
        # dynamo reads the flag from the global config while it traces, not from torch.compile's options
        with torch._inductor.config.patch(freezing=bucket >= PACKED_FROM):
            logits, hidden = self.forward(input_ids, positions, mask)
        return logits[0, :size], None if hidden is None else hidden[0, :size]

    def keep(self, rows: list[int]) -> None:
        """Copy the kept rows into place behind the past and set the cache's length to past + kept."""
        past, kept = self.length, len(rows)
        if rows != list(range(kept)):
            index = host_to_device([past + row for row in rows], self.device, torch.long)
            for layer in self.cache.layers:
                layer.keys[..., past:past + kept, :] = layer.keys[..., index, :]
                layer.values[..., past:past + kept, :] = layer.values[..., index, :]
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(past + kept)
        self.length = past + kept


def make_target(model, feature_layers: tuple[int, ...], windows: dict[str, int | None], compile_: bool):
    """The engine's target: compiled where asked and the model has full attention only, else eager (said once)."""
    if compile_ and any(window is not None for window in windows.values()):
        print(f"warning: engine.compile=on: {type(model).__name__} has sliding-window layers, which the compiled "
              f"engine does not handle yet; it runs eager", file=sys.stderr)
        compile_ = False
    return CompiledTarget(model, feature_layers, windows) if compile_ else EagerTarget(model, feature_layers, windows)
