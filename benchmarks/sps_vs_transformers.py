"""SpS with a draft model: ours on the shared engine vs transformers' `generate(assistant_model=...)`.

    python benchmarks/sps_vs_transformers.py --questions 4 --max-new-tokens 128 [--dtype float32] [--gamma 5]
                                             [--adaptive] [--draft PATH]

Four contenders decode the same chat prompts greedily, interleaved question by question: our vanilla, our SpS
(methods/sps/ with method=sps's draft for the model, `method.drafter.draft_path`), transformers'
`generate(do_sample=False)` and its assisted generation with the same draft as a full HF model (the target's
embedding and LM head attached) and the same γ (constant, or transformers' "heuristic_transient" schedule with
--adaptive; its confidence-threshold early stop is off so both draft the same chains). Prints each SpS's speedup
over its own vanilla, its mean accepted tokens (new tokens per target forward, the prefill included; forwards
counted by wrapping forward) and draft forwards.
"""
from __future__ import annotations

import argparse

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from benchmarks.common import (
    ForwardCounter,
    count_forwards,
    hf_generate,
    interleave,
    make_parser,
    print_comparison,
    setup,
)
from methods.sps.draft import load_draft
from methods.sps.drafter import DraftModelDrafter


def parse_args() -> argparse.Namespace:
    parser = make_parser(__doc__, questions=4, max_new_tokens=128)
    parser.add_argument("--gamma", type=int, default=None, help="draft tokens per step (default: conf/method/sps.yaml)")
    parser.add_argument("--adaptive", action="store_true", help="adapt γ (+2 / -1) on both sides")
    parser.add_argument("--draft", default=None, help="draft folder or hub id (default: method=sps's draft_path)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
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
    vanilla = SpeculativeEngine(model)
    sps = SpeculativeEngine(model, DraftModelDrafter(model, tokenizer, draft_model=draft, num_draft_tokens=gamma,
                                                     adaptive=args.adaptive))
    contenders = {
        "vanilla": lambda p: vanilla.generate(p, stop).tokens,
        "sps": lambda p: sps.generate(p, stop).tokens,
        "hf vanilla": lambda p: hf_generate(model, p, args.max_new_tokens),
        "hf assisted": lambda p: hf_generate(model, p, args.max_new_tokens, assistant_model=draft),
    }
    contenders, forwards = count_forwards(contenders, {"target": ForwardCounter(model), "draft": ForwardCounter(draft)})
    totals = interleave(prompts, contenders, model.device)
    print(f"{len(prompts)} questions, up to {args.max_new_tokens} new tokens, {model.dtype}, γ={gamma}"
          f"{' adaptive' if args.adaptive else ''}, draft {draft_path} "
          f"({draft.config.num_hidden_layers} layers)")
    print_comparison(totals, forwards, [("sps", "vanilla"), ("hf assisted", "hf vanilla")])


if __name__ == "__main__":
    main()
