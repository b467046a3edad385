"""Is our vanilla baseline as fast as transformers' `generate(do_sample=False)`? (A slow baseline inflates speedups.)

    python benchmarks/vanilla_vs_generate.py --questions 8 --max-new-tokens 128

Both decode the same prompts greedily, interleaved prompt by prompt; prints tokens/s of each and the ratio.
"""
from __future__ import annotations

from benchmarks.common import hf_generate, interleave, make_parser, setup
from bench.engine import SpeculativeEngine, StopCondition


def main() -> None:
    args = make_parser(__doc__).parse_args()
    model, _, prompts, eos = setup(args)
    engine = SpeculativeEngine(model)
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    totals = interleave(prompts, {
        "specbench vanilla": lambda p: engine.generate(p, stop).tokens,
        "transformers generate": lambda p: hf_generate(model, p, args.max_new_tokens),
    }, model.device)
    for name, t in totals.items():
        print(f"{name:24s} {t['tokens']:6d} tokens in {t['seconds']:7.2f} s = {t['tokens'] / t['seconds']:6.2f} tok/s")
    ours, theirs = (t["tokens"] / t["seconds"] for t in totals.values())
    same = sum(a == b for a, b in zip(*(t["outputs"] for t in totals.values())))
    print(f"ratio (ours / generate): {ours / theirs:.3f}   identical outputs: {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
