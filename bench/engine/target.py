"""The target model as the batch-1 engine runs it: a prefill, verification forwards over a KV cache, and the cache
cut back to the accepted path. Two ways, the same tokens:

- `EagerTarget`: transformers' forward over a DynamicCache (every layer keeps every position; the cache grows and is
  cropped each step). Any model the engine supports.
- `CompiledTarget` (`engine.compile=on`): the cache preallocated for the turn (transformers' StaticCache), each
  verification forward padded to a bucket and run by its compiled graph (bench/engine/compiled.py's recipe). The
  accepted rows are copied into place and the cache's length set back, with no crop. Full-attention models only (a
  windowed layer falls back to eager, said in one line).
"""
from __future__ import annotations

import sys

import torch
from transformers import StaticCache

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
from bench.engine.kvcache import host_to_device, keep_accepted_kv, new_cache, tree_attention_mask
from bench.engine.tree import DraftTree


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
        self.forward = compile_step(self._step)

    def _step(self, input_ids, position_ids, attention_mask):
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         cache=self.cache, output_hidden_states=bool(self.feature_layers))
        return out.logits, features_of(out, self.feature_layers)

    def reserve(self, positions: int) -> None:
        """A cache of at least `positions` (and the bucket's slack); a new size means new graphs, so a run reserves
        its longest turn once, before precompile."""
        if positions + BUCKETS[-1] > self.capacity or self.cache is None:
            if self.capacity:
                print(f"note: engine.compile=on: a turn of {positions} positions outgrew the cache; its graphs are "
                      f"made again", file=sys.stderr)
            self.capacity = capacity_for(positions)
            self.cache = StaticCache(self.model.config, max_cache_len=self.capacity)
            self.masks.clear()

    def prefill(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.reserve(len(prompt_ids) + max_new_tokens)
        self.cache.reset()
        self.length = len(prompt_ids)
        out = self._run(input_ids=torch.tensor([prompt_ids], device=self.device), logits_to_keep=1)
        unmark_static(self.cache)  # made during the prefill
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
        freeze = frozen(bucket, self.model.dtype, self.device)
        logits, hidden = call_compiled(self.forward, freeze, past + bucket, input_ids, positions, mask)
        return logits[0, :size], None if hidden is None else hidden[0, :size]

    def keep(self, rows: list[int]) -> None:
        """Copy the kept rows into place behind the past and set the cache's length to past + kept."""
        past, kept = self.length, len(rows)
        if rows != list(range(kept)):
            index = host_to_device([past + row for row in rows], self.device, torch.long)
            for layer in self.cache.layers:
                layer.keys[..., past:past + kept, :] = layer.keys[..., index, :]
                layer.values[..., past:past + kept, :] = layer.values[..., index, :]
        self.hold(past + kept)

    def hold(self, length: int) -> None:
        """Take the cache's first `length` positions as the past (keep's last move; the profile times forwards after
        a context this way, whatever those positions hold)."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)
        self.length = length


def make_target(model, feature_layers: tuple[int, ...], windows: dict[str, int | None], compile_: bool):
    """The engine's target: compiled where asked and the model has full attention only, else eager (said once)."""
    if compile_ and any(window is not None for window in windows.values()):
        print(f"warning: engine.compile=on: {type(model).__name__} has sliding-window layers, which the compiled "
              f"engine does not handle yet; it runs eager", file=sys.stderr)
        compile_ = False
    return CompiledTarget(model, feature_layers, windows) if compile_ else EagerTarget(model, feature_layers, windows)
