"""Prompt lookup decoding: ours on the shared engine vs transformers' `generate(prompt_lookup_num_tokens=...)`.

    python benchmarks/pld_vs_transformers.py --questions 4 --max-new-tokens 128 [--dtype float32]

Four contenders decode the same chat prompts greedily, interleaved question by question: our vanilla, our PLD
(knobs from conf/method/pld.yaml), transformers' `generate(do_sample=False)` and its prompt lookup with the same
num_pred_tokens and max_ngram_size. Prints each PLD's speedup over its own vanilla and its mean accepted tokens
(new tokens per target forward, the prefill included; forwards are counted by wrapping model.forward).
"""
from __future__ import annotations

from omegaconf import OmegaConf

from bench.engine import SpeculativeEngine, StopCondition
from bench.run import PROJECT_ROOT
from benchmarks.common import ForwardCounter, hf_generate, interleave, parse_args, setup
from methods.pld import PromptLookupDrafter


def main() -> None:
    args = parse_args(__doc__, questions=4, max_new_tokens=128)
    model, tokenizer, prompts, eos = setup(args)
    knobs = OmegaConf.to_container(OmegaConf.load(PROJECT_ROOT / "conf" / "method" / "pld.yaml").drafter)
    knobs.pop("_target_")
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    vanilla = SpeculativeEngine(model)
    pld = SpeculativeEngine(model, PromptLookupDrafter(model, tokenizer, **knobs))
    counter = ForwardCounter(model)
    forwards: dict[str, list[int]] = {}

    def counted(name, decode):
        def run(prompt):
            before = counter.calls
            tokens = decode(prompt)
            forwards.setdefault(name, []).append(counter.calls - before)
            return tokens
        return run

    contenders = {
        "vanilla": lambda p: vanilla.generate(p, stop).tokens,
        "pld": lambda p: pld.generate(p, stop).tokens,
        "hf vanilla": lambda p: hf_generate(model, p, args.max_new_tokens),
        "hf pld": lambda p: hf_generate(model, p, args.max_new_tokens, max_matching_ngram_size=knobs["max_ngram_size"],
                                        prompt_lookup_num_tokens=knobs["num_pred_tokens"]),
    }
    totals = interleave(prompts, {name: counted(name, fn) for name, fn in contenders.items()}, model.device)
    print(f"{len(prompts)} questions, up to {args.max_new_tokens} new tokens, {model.dtype}, PLD knobs {knobs}")
    for name, t in totals.items():
        calls = sum(forwards[name][1:])  # the first call was interleave's warm-up
        print(f"{name:11s} {t['tokens']:6d} tokens {t['seconds']:7.2f} s {t['tokens'] / t['seconds']:7.2f} tok/s   "
              f"{calls:5d} forwards  mean accepted tokens {t['tokens'] / calls:.2f}")
    for ours, base in (("pld", "vanilla"), ("hf pld", "hf vanilla")):
        rate = {name: totals[name]["tokens"] / totals[name]["seconds"] for name in (ours, base)}
        speedup = rate[ours] / rate[base]
        same = sum(a == b for a, b in zip(totals[ours]["outputs"], totals[base]["outputs"]))
        print(f"{ours:7s} speedup over {base}: {speedup:.2f}x   identical outputs: {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
