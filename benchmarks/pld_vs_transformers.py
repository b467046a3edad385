"""Prompt lookup decoding: ours on the shared engine vs transformers' `generate(prompt_lookup_num_tokens=...)`.

    python benchmarks/pld_vs_transformers.py --questions 4 --max-new-tokens 128 [--dtype float32]

Four contenders decode the same chat prompts greedily, interleaved question by question: our vanilla, our PLD
(knobs from conf/method/pld.yaml), transformers' `generate(do_sample=False)` and its prompt lookup with the same
num_pred_tokens and max_ngram_size. Prints each PLD's speedup over its own vanilla and its mean accepted tokens
(new tokens per target forward, the prefill included; forwards are counted by wrapping model.forward).
"""
from __future__ import annotations

from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.settings import drafter_settings
from benchmarks.common import (
    ForwardCounter,
    count_forwards,
    hf_generate,
    interleave,
    make_parser,
    print_comparison,
    setup,
)


def main() -> None:
    args = make_parser(__doc__, questions=4, max_new_tokens=128).parse_args()
    model, tokenizer, prompts, eos = setup(args)
    pld_yaml = OmegaConf.load(PROJECT_ROOT / "conf" / "method" / "pld.yaml")
    drafter = build_drafter(drafter_settings(pld_yaml), model, tokenizer, SamplingConfig())
    knobs = {"max_ngram_size": drafter.max_ngram_size, "num_pred_tokens": drafter.num_pred_tokens}
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    vanilla = SpeculativeEngine(model)
    pld = SpeculativeEngine(model, drafter)
    contenders = {
        "vanilla": lambda p: vanilla.generate(p, stop).tokens,
        "pld": lambda p: pld.generate(p, stop).tokens,
        "hf vanilla": lambda p: hf_generate(model, p, args.max_new_tokens),
        "hf pld": lambda p: hf_generate(model, p, args.max_new_tokens, max_matching_ngram_size=knobs["max_ngram_size"],
                                        prompt_lookup_num_tokens=knobs["num_pred_tokens"]),
    }
    contenders, forwards = count_forwards(contenders, {"target": ForwardCounter(model)})
    totals = interleave(prompts, contenders, model.device)
    print(f"{len(prompts)} questions, up to {args.max_new_tokens} new tokens, {model.dtype}, PLD knobs {knobs}")
    print_comparison(totals, forwards, [("pld", "vanilla"), ("hf pld", "hf vanilla")])


if __name__ == "__main__":
    main()
