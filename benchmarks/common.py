"""Shared set-up for the side-by-side benchmark scripts: model, prompts, interleaved timing."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from omegaconf import OmegaConf

from bench.models import load_model
from bench.run import PROJECT_ROOT, eos_token_ids
from bench.timing import timed
from tasks import QUESTIONS_FILE, build_prompt


def parse_args(description: str, **defaults) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml")
    parser.add_argument("--dtype", default=None, help="override the model config's dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--questions", type=int, default=defaults.get("questions", 8))
    parser.add_argument("--max-new-tokens", type=int, default=defaults.get("max_new_tokens", 128))
    parser.add_argument("--categories", default=defaults.get("categories", ""),
                        help="comma-separated question categories (default: spread over all)")
    return parser.parse_args()


def setup(args: argparse.Namespace):
    """(model, tokenizer, prompts, eos ids) for the first turns of `args.questions` Spec-Bench questions."""
    cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / f"{args.model}.yaml")
    if args.dtype:
        cfg.dtype = args.dtype
    model, tokenizer = load_model(cfg, torch.device(args.device))
    questions = [json.loads(line) for line in QUESTIONS_FILE.read_text().splitlines()]
    if args.categories:
        wanted = set(args.categories.split(","))
        questions = [q for q in questions if q["category"] in wanted]
    step = max(1, len(questions) // args.questions)
    picked = questions[::step][: args.questions]
    prompts = [build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in picked]
    return model, tokenizer, prompts, eos_token_ids(model, tokenizer)


class ForwardCounter:
    """Counts calls of model.forward (target forwards, for mean accepted tokens)."""

    def __init__(self, model):
        self.calls = 0
        original = model.forward

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        model.forward = counted


def interleave(prompts: list[list[int]], contenders: dict[str, Callable[[list[int]], list[int]]], device) -> dict:
    """Run every contender on each prompt in turn (order rotating per prompt) and total tokens and seconds.

    Each contender returns its new token ids. Returns {name: {"tokens", "seconds", "outputs"}}.
    """
    names = list(contenders)
    totals = {name: {"tokens": 0, "seconds": 0.0, "outputs": []} for name in names}
    for name in names:  # warm-up, untimed
        contenders[name](prompts[0][:32])
    for index, prompt in enumerate(prompts):
        for name in names[index % len(names):] + names[: index % len(names)]:
            with timed(device) as elapsed:
                tokens = contenders[name](prompt)
            totals[name]["tokens"] += len(tokens)
            totals[name]["seconds"] += elapsed[0]
            totals[name]["outputs"].append(tokens)
    return totals


def hf_generate(model, prompt: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """New token ids from transformers' own greedy `generate`."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, **kwargs)
    return out[0, len(prompt):].tolist()
