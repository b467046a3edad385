"""Tiny, randomly initialised checkpoints with a real (byte-level BPE) tokenizer, written to disk so the whole CLI
path (config -> load -> tasks -> engine -> records) runs in seconds: a Llama chat model with a chat template, and a
Gemma-3-style base model (sliding-window attention, no chat template, a BOS token added to plain text)."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from tasks import QUESTIONS_FILE
from tests.conftest import tiny_config

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_checkpoint(path: Path, base_model: bool = False) -> Path:
    """The chat model, or (base_model) the windowed base model with a 512-token context window."""
    bos, eos = ("<bos>", "<eos>") if base_model else ("<|im_start|>", "<|im_end|>")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[bos, eos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(QUESTIONS_FILE.read_text().splitlines()[:100], trainer)
    if base_model:
        bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                           special_tokens=[(bos, bpe.token_to_id(bos))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=bos)
    if not base_model:
        tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = tiny_config("gemma3" if base_model else "llama", vocab_size=len(tokenizer),
                         max_position_embeddings=512 if base_model else 4096, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.eos_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
