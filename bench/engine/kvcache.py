"""The engine's KV cache and the attention masks of a tree step, for the attention layers it can roll back.

Every layer gets a plain `DynamicLayer` that keeps all positions, so compacting the cache to the accepted path
(`keep_accepted_kv`: an index copy and a crop) works alike for every layer. Sliding-window layers
still see only their window: on a one-token or chain step the model's own mask functions apply it (they size the
mask from the cache, which holds everything), and on a tree step, where the model takes the engine's 4-D mask as
is, `tree_attention_mask` applies it. transformers' own sliding-window layers keep only the last `window`
positions, so a step's rejected rows could not be taken back out of them. Recurrent and linear-attention states
(Mamba, RWKV, Qwen3-Next...) cannot be rolled back by position at all, and chunked attention (Llama 4) would need
its own tree mask: such models are refused at start.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

ROLLBACK_SAFE = ("full_attention", "sliding_attention")


class UnsupportedModelError(ValueError):
    """The model has layers whose cache the engine cannot cut back to the accepted tokens (a one-line message)."""


def attention_windows(model) -> dict[str, int | None]:
    """The model's attention layer types and the window of each (None: full attention), as the engine's masks
    need them; raises UnsupportedModelError (one line naming the layer type) for any other layer."""
    config = model.config.get_text_config(decoder=True)
    name = f"model type '{config.model_type or type(model).__name__}'"
    supported = f"the engine can verify drafts and cut the cache back for {' and '.join(ROLLBACK_SAFE)} layers only"
    if not getattr(model, "_supports_default_dynamic_cache", lambda: True)():  # RWKV, xLSTM, Reformer...
        raise UnsupportedModelError(f"{name} keeps a recurrent state outside the KV cache; {supported}")
    windows: dict[str, set] = {}
    for layer_type, kwargs in zip(*get_layer_types_and_kwargs(config)):
        if layer_type not in ROLLBACK_SAFE:
            raise UnsupportedModelError(f"{name} has '{layer_type}' layers; {supported}")
        windows.setdefault(layer_type, set()).add(kwargs.get("sliding_window"))
    if any(len(sizes) > 1 for sizes in windows.values()):
        raise UnsupportedModelError(f"{name} gives layers of one type different windows ({windows}); the engine "
                                    f"masks per layer type")
    return {layer_type: sizes.pop() for layer_type, sizes in windows.items()}


def new_cache() -> DynamicCache:
    """An empty cache whose layers (created on first use) all keep every position, windowed or not."""
    return DynamicCache()


def host_to_device(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host data (Python lists or a host tensor) on `device` without stalling the host: on CUDA it goes through
    pinned memory and an asynchronous copy, where `torch.tensor(data, device=cuda)` or `.to(cuda)` of a pageable
    tensor waits until the copy is done, i.e. until the device's queue has drained."""
    host = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    device = torch.device(device)
    if host.device == device:
        return host
    if device.type == "cuda" and host.device.type == "cpu":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def tree_attention_mask(local: torch.Tensor, offsets: torch.Tensor, past_len: int, windows: dict[str, int | None],
                        dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive 4-D mask [1, 1, L, past_len + L] of a tree step: 0 where a query may attend, dtype-min elsewhere.

    local: [L, L] bool, which step inputs each step input sees; offsets: [L] positions relative to the root; both on
    the model's device (DraftTree.on_device). A windowed layer type also hides keys `window` or more positions behind
    the query (transformers' rule: key > query - window). One mask when every layer type has the same window, else
    {layer type: mask}, the form that models mixing windowed and full layers (Gemma 2/3, Qwen2...) take.
    """
    length, device = len(offsets), offsets.device
    allowed = torch.ones(length, past_len + length, dtype=torch.bool, device=device)  # [L, past + L]
    allowed[:, past_len:] = local
    queries = offsets + past_len  # [L] positions
    keys = torch.cat([torch.arange(past_len, device=device), queries])  # [past + L] positions
    return additive_masks(allowed[None], queries[None], keys[None], windows, dtype)


def additive_masks(allowed: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, windows: dict[str, int | None],
                   dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive 4-D masks [B, 1, L, K] from what each query may attend (allowed: [B, L, K] bool) and the positions
    of queries ([B, L]) and keys ([B, K]); a windowed layer type also hides keys `window` or more positions behind
    the query. One mask when every layer type has the same window, else {layer type: mask}."""
    masks = {}
    for window in set(windows.values()):
        visible = allowed if window is None else allowed & (keys[:, None, :] > queries[:, :, None] - window)
        mask = torch.zeros(visible.shape[0], 1, *visible.shape[1:], dtype=dtype, device=visible.device)
        masks[window] = mask.masked_fill_(~visible[:, None], torch.finfo(dtype).min)
    if len(masks) == 1:
        return masks.popitem()[1]
    return {layer_type: masks[window] for layer_type, window in windows.items()}


def keep_accepted_kv(cache: DynamicCache, past_len: int, rows: list[int]) -> None:
    """Keep past_len cached positions plus the step's inputs at `rows`, in that order; drop the rest."""
    kept = past_len + len(rows)
    if rows != list(range(len(rows))):
        index = host_to_device([past_len + row for row in rows], cache.layers[0].keys.device, torch.long)
        for layer in cache.layers:
            layer.keys[..., past_len:kept, :] = layer.keys[..., index, :]
            layer.values[..., past_len:kept, :] = layer.values[..., index, :]
    surplus = cache.get_seq_length() - kept
    if surplus:
        cache.crop(-surplus)


def move_kept_rows(cache, past: int, kept_rows: list[list[int]]) -> None:
    """A batch step's kept inputs to the front of its slots: row b's inputs at `kept_rows[b]` (slots past + row) are
    moved, in that order, to slots past, past + 1, ... of every layer of `cache` ([B, heads, slots, dim])."""
    if all(rows == list(range(len(rows))) for rows in kept_rows):
        return
    most = max(map(len, kept_rows))
    device = cache.layers[0].keys.device
    index = host_to_device([[past + row for row in rows] + [past] * (most - len(rows)) for rows in kept_rows],
                           device, torch.long)
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            spread = index[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
            tensor[:, :, past : past + most] = tensor.gather(2, spread)
