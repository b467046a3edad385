"""Ours beside transformers' own decoding on the same chat prompts (first turns spread over the Spec-Bench
questions), greedy, interleaved question by question (the order rotating, after an untimed warm-up):

    python -m studies.vs_transformers vanilla --questions 8 --max-new-tokens 128 [--batch-size 4] [--compile]
    python -m studies.vs_transformers pld --questions 4 --max-new-tokens 128 [--dtype float32]
    python -m studies.vs_transformers sps --questions 4 --max-new-tokens 128 [--gamma 5] [--adaptive] [--draft PATH]

vanilla: is our baseline as fast as transformers' `generate(do_sample=False)`? (A slow baseline inflates speedups.)
Prints tokens/s of each and the ratio. At --batch-size B > 1 ours is the batched engine (bench/engine/batched.py, what
`gen.batch_size=B` runs) and transformers' decodes the same B prompts left-padded, its own way; tokens after a row's
EOS are not counted. With --compile (batch 1): our compiled engine (engine.compile=on) against transformers' own
fastest recipe, `generate` over its static cache with its forward compiled (`cache_implementation="static"`, a
CompileConfig allowed on every device), each on its own copy of the weights; every graph of both made before timing
(an untimed decode of the longest prompt).

pld: our vanilla, our PLD (knobs from conf/method/pld.yaml), transformers' `generate(do_sample=False)` and its prompt
lookup (`prompt_lookup_num_tokens`) with the same num_pred_tokens and max_ngram_size.

sps: our vanilla, our SpS (methods/sps/ with method=sps's draft for the model, `method.drafter.draft_path`),
transformers' `generate(do_sample=False)` and its assisted generation with the same draft as a full HF model (the
target's embedding and LM head attached) and the same γ (constant, or transformers' "heuristic_transient" schedule
with --adaptive; its confidence-threshold early stop is off so both draft the same chains).

pld and sps print each method's speedup over its own vanilla, its mean accepted tokens (new tokens per target
forward, the prefill included; forwards counted by wrapping model.forward) and, for sps, draft forwards. Time it on a
quiet machine.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.config import compose_config
from bench.engine.batched import BatchedEngine
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.engine.timing import timed
from bench.measure.assemble import build_drafter
from bench.models import eos_token_ids, load_model
from bench.settings import drafter_settings
from methods.sps.draft import load_draft
from methods.sps.drafter import DraftModelDrafter
from tasks import first_turn_prompts, read_questions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m studies.vs_transformers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml")
    common.add_argument("--dtype", default=None, help="override the model config's dtype")
    common.add_argument("--device", default="cpu")
    common.add_argument("--questions", type=int, default=8)
    common.add_argument("--max-new-tokens", type=int, default=128)
    common.add_argument("--categories", default="", help="comma-separated question categories (default: all)")
    sides = parser.add_subparsers(dest="method", required=True)
    plain = sides.add_parser("vanilla", parents=[common])
    plain.add_argument("--batch-size", type=int, default=1)
    plain.add_argument("--compile", action="store_true", help="compiled decoding on both sides (batch 1)")
    sides.add_parser("pld", parents=[common]).set_defaults(questions=4)
    sps = sides.add_parser("sps", parents=[common])
    sps.set_defaults(questions=4)
    sps.add_argument("--gamma", type=int, default=None, help="draft tokens per step (default: conf/method/sps.yaml)")
    sps.add_argument("--adaptive", action="store_true", help="adapt γ (+2 / -1) on both sides")
    sps.add_argument("--draft", default=None, help="draft folder or hub id (default: method=sps's draft_path)")
    return parser.parse_args(argv)


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


def interleave(prompts: list, contenders: dict[str, Callable], device, warm_up=None) -> dict:
    """Run every contender on each prompt in turn (order rotating per prompt) and total tokens and seconds, after an
    untimed call of each on `warm_up` (default: the first prompt's first 32 tokens).

    Each contender returns its new token ids. Returns {name: {"tokens", "seconds", "outputs"}}.
    """
    names = list(contenders)
    totals = {name: {"tokens": 0, "seconds": 0.0, "outputs": []} for name in names}
    for name in names:  # warm-up, untimed
        contenders[name](prompts[0][:32] if warm_up is None else warm_up)
    for index, prompt in enumerate(prompts):
        for name in names[index % len(names):] + names[: index % len(names)]:
            with timed(device) as elapsed:
                tokens = contenders[name](prompt)
            totals[name]["tokens"] += len(tokens)
            totals[name]["seconds"] += elapsed.wall
            totals[name]["outputs"].append(tokens)
    return totals


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
        same = sum(a == b for a, b in zip(totals[ours]["outputs"], totals[base]["outputs"]))
        print(f"{ours:11s} speedup over {base}: {rate[ours] / rate[base]:.2f}x   identical outputs: "
              f"{same}/{len(totals[base]['outputs'])}")


def hf_generate(model, prompt: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """New token ids from transformers' own greedy `generate`."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, **kwargs)
    return out[0, len(prompt):].tolist()


def hf_generate_batch(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Every row's new tokens (up to and including its first EOS) from transformers' batched greedy `generate`."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    tokens = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        tokens += row[:end]
    return tokens


def hf_compiled_generate(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """New token ids from transformers' greedy `generate` over its static cache, its forward compiled (on any
    device: transformers compiles only on accelerators unless told)."""
    from transformers import CompileConfig

    config = CompileConfig(mode="default")  # "reduce-overhead" is CUDA graphs
    config._compile_all_devices = True
    return hf_generate(model, prompt, max_new_tokens, cache_implementation="static", compile_config=config)


def vanilla(args: argparse.Namespace) -> None:
    model, tokenizer, prompts, eos = setup(args)
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    items, warm_up = prompts, None
    if args.compile:
        if args.batch_size != 1:
            raise SystemExit("--compile: batch 1 only (the compiled engine decodes one sequence at a time)")
        their_model = setup(args)[0]  # weights of its own: the compiled engine routes the model's attention its way
        engine = SpeculativeEngine(model, compile=True)
        warm_up = max(prompts, key=len)  # the longest turn: every graph of both sides made before timing
        engine.target.reserve(len(warm_up) + args.max_new_tokens)
        contenders = {"specbench vanilla, compiled": lambda p: engine.generate(p, stop).tokens,
                      "transformers generate, static cache + compile": lambda p: hf_compiled_generate(
                          their_model, p, args.max_new_tokens)}
    elif args.batch_size == 1:
        engine = SpeculativeEngine(model)
        contenders = {"specbench vanilla": lambda p: engine.generate(p, stop).tokens,
                      "transformers generate": lambda p: hf_generate(model, p, args.max_new_tokens)}
    else:
        batched = BatchedEngine(model)
        contenders = {
            "specbench vanilla": lambda ps: [t for out in batched.generate(ps, stop, [None] * len(ps)).turns
                                             for t in out.tokens],
            "transformers generate": lambda ps: hf_generate_batch(model, tokenizer, ps, args.max_new_tokens, set(eos)),
        }
        items = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    totals = interleave(items, contenders, model.device, warm_up)
    for name, t in totals.items():
        print(f"{name:24s} {t['tokens']:6d} tokens in {t['seconds']:7.2f} s = {t['tokens'] / t['seconds']:6.2f} tok/s")
    ours, theirs = (t["tokens"] / t["seconds"] for t in totals.values())
    same = sum(a == b for a, b in zip(*(t["outputs"] for t in totals.values())))
    print(f"batch {args.batch_size}: ratio (ours / generate): {ours / theirs:.3f}   identical outputs: "
          f"{same}/{len(items)}")


def pld(args: argparse.Namespace) -> None:
    model, tokenizer, prompts, eos = setup(args)
    method = compose_config("method=pld", f"model={args.model}").method
    drafter = build_drafter(drafter_settings(method), model, tokenizer, SamplingConfig())
    knobs = {"max_ngram_size": drafter.max_ngram_size, "num_pred_tokens": drafter.num_pred_tokens}
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    vanilla_engine, pld_engine = SpeculativeEngine(model), SpeculativeEngine(model, drafter)
    contenders = {
        "vanilla": lambda p: vanilla_engine.generate(p, stop).tokens,
        "pld": lambda p: pld_engine.generate(p, stop).tokens,
        "hf vanilla": lambda p: hf_generate(model, p, args.max_new_tokens),
        "hf pld": lambda p: hf_generate(model, p, args.max_new_tokens, max_matching_ngram_size=knobs["max_ngram_size"],
                                        prompt_lookup_num_tokens=knobs["num_pred_tokens"]),
    }
    contenders, forwards = count_forwards(contenders, {"target": ForwardCounter(model)})
    totals = interleave(prompts, contenders, model.device)
    print(f"{len(prompts)} questions, up to {args.max_new_tokens} new tokens, {model.dtype}, PLD knobs {knobs}")
    print_comparison(totals, forwards, [("pld", "vanilla"), ("hf pld", "hf vanilla")])


def sps(args: argparse.Namespace) -> None:
    model, tokenizer, prompts, eos = setup(args)
    knobs = compose_config("method=sps", f"model={args.model}").method.drafter
    gamma = args.gamma or knobs.num_draft_tokens
    draft_path = args.draft or knobs.draft_path
    draft = load_draft(draft_path, model)
    assistant_config = draft.generation_config
    assistant_config.num_assistant_tokens = gamma
    assistant_config.num_assistant_tokens_schedule = "heuristic_transient" if args.adaptive else "constant"
    assistant_config.assistant_confidence_threshold = 0.0
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    vanilla_engine = SpeculativeEngine(model)
    sps_engine = SpeculativeEngine(model, DraftModelDrafter(model, tokenizer, draft_model=draft,
                                                            num_draft_tokens=gamma, adaptive=args.adaptive))
    contenders = {
        "vanilla": lambda p: vanilla_engine.generate(p, stop).tokens,
        "sps": lambda p: sps_engine.generate(p, stop).tokens,
        "hf vanilla": lambda p: hf_generate(model, p, args.max_new_tokens),
        "hf assisted": lambda p: hf_generate(model, p, args.max_new_tokens, assistant_model=draft),
    }
    contenders, forwards = count_forwards(contenders, {"target": ForwardCounter(model), "draft": ForwardCounter(draft)})
    totals = interleave(prompts, contenders, model.device)
    print(f"{len(prompts)} questions, up to {args.max_new_tokens} new tokens, {model.dtype}, γ={gamma}"
          f"{' adaptive' if args.adaptive else ''}, draft {draft_path} ({draft.config.num_hidden_layers} layers)")
    print_comparison(totals, forwards, [("sps", "vanilla"), ("hf assisted", "hf vanilla")])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    {"vanilla": vanilla, "pld": pld, "sps": sps}[args.method](args)


if __name__ == "__main__":
    main()
