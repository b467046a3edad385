"""Stage 1 of training, self-distillation (`features.source=self_distill`): the target's own greedy answers to
ShareGPT prompts, read from `AnswerSettings` and handed on as training sequences (`answer_sequences`) to the
feature cache (methods/heads/features.py) or the SpS draft's trainer (methods/sps/train.py).

Medusa-2 and EAGLE recommend training heads on what the target itself writes, not on ShareGPT's ChatGPT answers:
the heads then learn the distribution they will draft for. The prompts are the first user turns of the ShareGPT
conversations, in file order, through the chat template with the generation prompt; those longer than
`features.self_distill.max_prompt_tokens` are skipped. Each is answered by the target greedily (batched, left-padded,
`transformers.generate`) for up to `features.self_distill.max_new_tokens` tokens, stopping at EOS.

The answers are generated once and kept in their own folder beside the feature cache (`features.self_distill.dir`),
one shard of `features.shard_sequences` answers at a time (written atomically), so an interrupted generation resumes
shard by shard and a larger `features.self_distill.num_prompts` only adds shards; its meta.json pins the model and
settings. The project commits the answers its heads train on (artifacts/answers/<model>, with a card.json): shards
found there under the same pins are copied in instead of generated. A feature sequence is the prompt + answer (its
last `features.seq_len` tokens when longer, right-padded when shorter) with the mask on the positions whose next
token is part of the answer.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from bench.artifacts import PROJECT_ROOT
from bench.corpora import sharegpt_conversations
from bench.errors import ConfigError
from bench.models import eos_token_ids
from methods.heads.common import save_atomically
from methods.heads.settings import AnswerSettings

COMMITTED_ANSWERS = PROJECT_ROOT / "artifacts" / "answers"  # <model name>/: answers-*.pt, meta.json, card.json


def answer_path(folder: Path, shard: int) -> Path:
    return folder / f"answers-{shard:05d}.pt"


def first_turn_prompts(tokenizer, max_tokens: int, corpus: str | None = None) -> Iterator[list[int]]:
    """Token ids of each ShareGPT conversation's first user turn through the chat template (generation prompt
    added), in file order; prompts longer than `max_tokens` are skipped."""
    for messages in sharegpt_conversations(corpus):
        if messages[0]["role"] != "user":
            continue
        text = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) <= max_tokens:
            yield ids


@torch.inference_mode()
def greedy_answers(target, prompts: list[list[int]], max_new_tokens: int, eos: set[int],
                   pad_id: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt (batched, left-padded), up to and including its first EOS."""
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=sorted(eos) or None,
                              pad_token_id=pad_id)
    out = target.generate(ids.to(target.device), attention_mask=attention.to(target.device), generation_config=config)
    answers = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        answers.append(row[:end])
    return answers


def committed_answers(settings: AnswerSettings) -> Path | None:
    """The project's committed answers for this target (artifacts/answers/<model name>), when they were made with
    the same settings (their meta.json pins), else None."""
    folder = COMMITTED_ANSWERS / str(settings.model.get("name"))
    meta = folder / "meta.json"
    if not meta.exists() or json.loads(meta.read_text())["settings"] != settings.pins():
        return None
    return folder


def copy_committed_shards(settings: AnswerSettings) -> None:
    """Copy the committed answer shards that `settings.folder` lacks into it, so no stint regenerates them."""
    committed = committed_answers(settings)
    if committed is None or committed.resolve() == settings.folder.resolve():
        return
    for shard in range(settings.shards):
        source, copy = answer_path(committed, shard), answer_path(settings.folder, shard)
        if source.exists() and not copy.exists():
            shutil.copyfile(source, copy)


def generate_answers(target, tokenizer, settings: AnswerSettings) -> Path:
    """Make (or complete) the answer shards for `settings.num_prompts` prompts; returns their folder."""
    from tqdm import tqdm

    folder, shard_size, shards = settings.folder, settings.shard_prompts, settings.shards
    folder.mkdir(parents=True, exist_ok=True)
    meta = folder / "meta.json"
    if meta.exists() and json.loads(meta.read_text())["settings"] != settings.pins():
        raise ConfigError(f"self-distillation answers in {folder} were made with other settings; delete them or set "
                          f"features.self_distill.dir")
    meta.write_text(json.dumps({"settings": settings.pins()}, indent=1) + "\n")
    copy_committed_shards(settings)
    done = sum(1 for i in range(shards) if answer_path(folder, i).exists())
    if done == shards:
        return folder
    prompts = first_turn_prompts(tokenizer, settings.max_prompt_tokens, settings.corpus)
    for _ in range(done * shard_size):  # skip what earlier runs answered
        next(prompts)
    eos = eos_token_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    bar = tqdm(total=shards * shard_size, initial=done * shard_size, desc="target's own answers", unit="prompt")
    for shard in range(done, shards):
        batch = [p for _, p in zip(range(shard_size), prompts)]
        if len(batch) < shard_size:
            raise ConfigError(f"ShareGPT ran out of first turns of at most {settings.max_prompt_tokens} tokens after "
                              f"{shard * shard_size + len(batch)}; lower features.self_distill.num_prompts")
        answers = answer_shard(target, batch, settings, eos, pad_id, bar)
        save_atomically({"prompts": batch, "answers": answers}, answer_path(folder, shard))
    bar.close()
    return folder


def answer_shard(target, prompts: list[list[int]], settings: AnswerSettings, eos: set[int], pad_id: int,
                 bar) -> list[list[int]]:
    """Answers to one shard's prompts in its order, generated in batches of similar length."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int] | None] = [None] * len(prompts)
    for start in range(0, len(order), settings.batch_size):
        rows = order[start : start + settings.batch_size]
        for row, answer in zip(rows, greedy_answers(target, [prompts[i] for i in rows], settings.max_new_tokens, eos,
                                                    pad_id)):
            answers[row] = answer
        bar.update(len(rows))
    return answers


def stored_answers(settings: AnswerSettings) -> Iterator[tuple[list[int], list[int]]]:
    """(prompt, answer) pairs of the answer shards, in order."""
    for shard in range(settings.shards):
        saved = torch.load(answer_path(settings.folder, shard))
        yield from zip(saved["prompts"], saved["answers"])


def answer_block(prompt: list[int], answer: list[int], seq_len: int, pad_id: int) -> tuple[list[int], list[bool]]:
    """(ids, mask) of one prompt + answer as a seq_len block: the last seq_len tokens, right-padded with pad_id;
    mask[p] is true where token p + 1 belongs to the answer."""
    ids = (prompt + answer)[-seq_len:]
    last_prompt = len(prompt) - 1 - (len(prompt) + len(answer) - len(ids))  # the last prompt token's index, cut
    mask = [max(last_prompt, 0) <= p < len(ids) - 1 for p in range(len(ids))]
    padding = seq_len - len(ids)
    return ids + [pad_id] * padding, mask + [False] * padding


def answer_sequences(target, tokenizer, settings: AnswerSettings,
                     seq_len: int) -> Iterator[tuple[list[int], list[bool]]]:
    """The answers as (ids, mask) training sequences of seq_len tokens (answer_block), in order: what a feature cache
    of features.source=self_distill and the SpS draft train on. Lazy: the answers are generated (or completed) when
    the first sequence is asked for, so a complete feature cache never needs them."""
    generate_answers(target, tokenizer, settings)
    eos = eos_token_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    for prompt, answer in stored_answers(settings):
        yield answer_block(prompt, answer, seq_len, pad_id)
