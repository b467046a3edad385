"""Per-call draft cost and acceptance of the trained-head methods, with the draft-vocabulary slice and without it.

    python -m benchmarks.draft_cost [--methods medusa eagle2 hydra] [--questions 4] [--max-new-tokens 96]

Runs each method's default drafter (conf/method/<m>.yaml on SmolLM2) twice on the same first turns: once as
configured (logits over the checkpoint's frequency-ranked slice of the target's LM head) and once with the full
vocabulary (the same heads projected through the whole LM head). Reports the median wall time of one `propose`
call, the median target verification forward for comparison, and mean accepted tokens. Time it on a quiet machine.
"""
from __future__ import annotations

import statistics
import time

import torch

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.settings import drafter_settings
from benchmarks.common import make_parser, setup
from methods.heads.common import DraftVocabulary


class Timed:
    """Wraps a drafter's propose and the target's forward with wall-clock timers."""

    def __init__(self, drafter, model):
        self.drafter, self.propose_times, self.forward_times = drafter, [], []
        original_propose, original_forward = drafter.propose, model.forward

        def propose(*args, **kwargs):
            start = time.perf_counter()
            out = original_propose(*args, **kwargs)
            self.propose_times.append(time.perf_counter() - start)
            return out

        def forward(*args, **kwargs):
            start = time.perf_counter()
            out = original_forward(*args, **kwargs)
            if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1 and "cache" in kwargs \
                    and kwargs["cache"].get_seq_length() > kwargs["input_ids"].shape[1]:
                self.forward_times.append(time.perf_counter() - start)
            return out

        drafter.propose, self.model, self._forward = propose, model, original_forward
        model.forward = forward

    def restore(self) -> None:
        self.model.forward = self._forward


def main() -> None:
    parser = make_parser(__doc__, questions=4, max_new_tokens=96)
    parser.add_argument("--methods", nargs="+", default=["medusa", "eagle2", "hydra"])
    args = parser.parse_args()
    model, tokenizer, prompts, eos = setup(args)
    eos = frozenset(eos)
    print(f"{'method':8} {'vocabulary':>10} {'propose ms':>10} {'verify ms':>9} {'#MAT':>6}")
    for method in args.methods:
        for full in (False, True):
            cfg = compose_config(f"method={method}", f"model={args.model}")
            drafter = build_drafter(drafter_settings(cfg.method), model, tokenizer, SamplingConfig())
            if full:
                drafter.vocab = DraftVocabulary(model.get_output_embeddings())
            timer = Timed(drafter, model)
            engine, accepted = SpeculativeEngine(model, drafter), []
            with torch.inference_mode():
                engine.generate(prompts[0], StopCondition(8, eos))  # warm-up
                timer.propose_times.clear(), timer.forward_times.clear()
                for prompt in prompts:
                    accepted += engine.generate(prompt, StopCondition(args.max_new_tokens, eos)).accept_lengths
            timer.restore()
            print(f"{method:8} {drafter.vocab.size:>10} {1000 * statistics.median(timer.propose_times):>10.1f} "
                  f"{1000 * statistics.median(timer.forward_times):>9.1f} {sum(accepted) / len(accepted):>6.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
