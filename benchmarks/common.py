"""Shared set-up for the side-by-side benchmark scripts: model, prompts, interleaved timing."""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.config import compose_config
from bench.engine.timing import timed
from bench.models import eos_token_ids, load_model
from tasks import first_turn_prompts, read_questions


def make_parser(description: str, **defaults) -> argparse.ArgumentParser:
    """The options every side-by-side script takes; a script adds its own before parsing."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml")
    parser.add_argument("--dtype", default=None, help="override the model config's dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--questions", type=int, default=defaults.get("questions", 8))
    parser.add_argument("--max-new-tokens", type=int, default=defaults.get("max_new_tokens", 128))
    parser.add_argument("--categories", default=defaults.get("categories", ""),
                        help="comma-separated question categories (default: spread over all)")
    return parser


def setup(args: argparse.Namespace):
    """(model, tokenizer, prompts, eos ids) for the first turns of `args.questions` Spec-Bench questions."""
    cfg = compose_config(f"model={args.model}").model  # with its defaults (smollm2_135m_bf16 extends smollm2_135m)
    if args.dtype:
        cfg.dtype = args.dtype
    model, tokenizer = load_model(cfg, torch.device(args.device))
    questions = read_questions(set(args.categories.split(",")) if args.categories else None)
    step = max(1, len(questions) // args.questions)
    prompts = first_turn_prompts(tokenizer, questions[::step][: args.questions])
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


def count_forwards(contenders: dict[str, Callable], counters: dict[str, ForwardCounter]):
    """Wrap each contender to record, per call, the forwards of every counted model (e.g. target, draft).

    Returns (wrapped contenders, {name: [{counter: forwards} per call]}).
    """
    forwards: dict[str, list[dict[str, int]]] = {name: [] for name in contenders}

    def wrap(name, decode):
        def run(prompt):
            before = {key: counter.calls for key, counter in counters.items()}
            tokens = decode(prompt)
            forwards[name].append({key: counter.calls - before[key] for key, counter in counters.items()})
            return tokens
        return run

    return {name: wrap(name, decode) for name, decode in contenders.items()}, forwards


def print_comparison(totals: dict, forwards: dict, pairs: list[tuple[str, str]]) -> None:
    """Per contender: tokens, time, tok/s, forwards per counted model, mean accepted tokens (tokens per target
    forward); then each (method, its baseline) pair's speedup and how many outputs are identical."""
    for name, t in totals.items():
        calls = forwards[name][1:]  # the first call was interleave's warm-up
        counts = {key: sum(call[key] for call in calls) for key in calls[0]}
        columns = "".join(f"{count:5d} {key} forwards  " for key, count in counts.items())
        print(f"{name:11s} {t['tokens']:6d} tokens {t['seconds']:7.2f} s {t['tokens'] / t['seconds']:7.2f} tok/s   "
              f"{columns} mean accepted tokens {t['tokens'] / counts['target']:.2f}")
    for ours, base in pairs:
        rate = {side: totals[side]["tokens"] / totals[side]["seconds"] for side in (ours, base)}
        speedup = rate[ours] / rate[base]
        same = sum(a == b for a, b in zip(totals[ours]["outputs"], totals[base]["outputs"]))
        total = len(totals[base]["outputs"])
        print(f"{ours:11s} speedup over {base}: {speedup:.2f}x   identical outputs: {same}/{total}")


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
            totals[name]["seconds"] += elapsed.wall
            totals[name]["outputs"].append(tokens)
    return totals


def hf_generate(model, prompt: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """New token ids from transformers' own greedy `generate`."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, **kwargs)
    return out[0, len(prompt):].tolist()
