"""Is our vanilla baseline as fast as transformers' `generate(do_sample=False)`? (A slow baseline inflates speedups.)

    python benchmarks/vanilla_vs_generate.py --questions 8 --max-new-tokens 128 [--batch-size 4]

Both decode the same prompts greedily, interleaved batch by batch; prints tokens/s of each and the ratio. At
--batch-size B > 1 ours is the batched engine (bench/engine/batched.py, what `gen.batch_size=B` runs) and transformers'
decodes the same B prompts left-padded, its own way; tokens after a row's EOS are not counted.
"""
from __future__ import annotations

import torch

from bench.engine.batched import BatchedEngine
from bench.engine.loop import SpeculativeEngine, StopCondition
from benchmarks.common import hf_generate, interleave, make_parser, setup


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


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args()
    model, tokenizer, prompts, eos = setup(args)
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    if args.batch_size == 1:
        engine = SpeculativeEngine(model)
        contenders = {"specbench vanilla": lambda p: engine.generate(p, stop).tokens,
                      "transformers generate": lambda p: hf_generate(model, p, args.max_new_tokens)}
        items = prompts
    else:
        batched = BatchedEngine(model)
        contenders = {
            "specbench vanilla": lambda ps: [t for out in batched.generate(ps, stop, [None] * len(ps)).turns
                                             for t in out.tokens],
            "transformers generate": lambda ps: hf_generate_batch(model, tokenizer, ps, args.max_new_tokens, set(eos)),
        }
        items = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    totals = interleave(items, contenders, model.device)
    for name, t in totals.items():
        print(f"{name:24s} {t['tokens']:6d} tokens in {t['seconds']:7.2f} s = {t['tokens'] / t['seconds']:6.2f} tok/s")
    ours, theirs = (t["tokens"] / t["seconds"] for t in totals.values())
    same = sum(a == b for a, b in zip(*(t["outputs"] for t in totals.values())))
    print(f"batch {args.batch_size}: ratio (ours / generate): {ours / theirs:.3f}   identical outputs: "
          f"{same}/{len(items)}")


if __name__ == "__main__":
    main()
