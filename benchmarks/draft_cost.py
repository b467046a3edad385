"""Per-call draft cost and acceptance of the trained-head methods, with the draft-vocabulary slice and without it.

    python -m benchmarks.draft_cost [--methods medusa eagle2 hydra] [--questions 4] [--max-new-tokens 96]
    python -m benchmarks.draft_cost --model smollm2_135m_bf16 --methods eagle2 eagle3 --breakdown

`--breakdown` (the configured vocabulary only) splits one `propose` call into the forwards of the drafter's modules
(head, heads, vocabulary projection, draft model, embeddings; mean ms per call) and the rest: top-k, tree and mask
building, host reads, Python.

Runs each method's default drafter (conf/method/<m>.yaml on SmolLM2) twice on the same first turns: once as
configured (logits over the checkpoint's frequency-ranked slice of the target's LM head) and once with the full
vocabulary (the same heads projected through the whole LM head). Reports the median wall time of one `propose`
call, the median target verification forward for comparison, and mean accepted tokens. Time it on a quiet machine.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch.nn import Module

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.settings import drafter_settings
from benchmarks.common import make_parser, setup
from methods.heads.common import DraftVocabulary

DRAFTER_MODULES = ("head", "heads", "vocab", "draft", "embed")


def time_module(module: Module, times: list[float]) -> None:
    """Append the wall time of each top-level call of `module` to `times` (nested calls of itself count once)."""
    started = []
    module.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
    module.register_forward_hook(lambda *_: times.append(time.perf_counter() - started.pop()))


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
        self.module_times = {name: [] for name in DRAFTER_MODULES if isinstance(getattr(drafter, name, None), Module)}
        for name in self.module_times:
            time_module(getattr(drafter, name), self.module_times[name])

    def restore(self) -> None:
        self.model.forward = self._forward


def breakdown(timer: Timed) -> str:
    """Mean ms per propose call in each drafter module and in the rest."""
    calls = len(timer.propose_times)
    per_module = {name: 1000 * sum(times) / calls for name, times in timer.module_times.items()}
    rest = 1000 * sum(timer.propose_times) / calls - sum(per_module.values())
    return "  ".join(f"{name} {ms:.1f}" for name, ms in {**per_module, "rest": rest}.items())


def main() -> None:
    parser = make_parser(__doc__, questions=4, max_new_tokens=96)
    parser.add_argument("--methods", nargs="+", default=["medusa", "eagle2", "hydra"])
    parser.add_argument("--breakdown", action="store_true", help="per-module split, configured vocabulary only")
    args = parser.parse_args()
    model, tokenizer, prompts, eos = setup(args)
    eos = frozenset(eos)
    print(f"{'method':8} {'vocabulary':>10} {'propose ms':>10} {'verify ms':>9} {'#MAT':>6}")
    for method in args.methods:
        for full in (False,) if args.breakdown else (False, True):
            cfg = compose_config(f"method={method}", f"model={args.model}")
            drafter = build_drafter(drafter_settings(cfg.method), model, tokenizer, SamplingConfig())
            if full:
                drafter.vocab = DraftVocabulary(model.get_output_embeddings())
            timer = Timed(drafter, model)
            engine, accepted = SpeculativeEngine(model, drafter), []
            with torch.inference_mode():
                engine.generate(prompts[0], StopCondition(8, eos))  # warm-up
                timer.propose_times.clear(), timer.forward_times.clear()
                for times in timer.module_times.values():
                    times.clear()
                for prompt in prompts:
                    accepted += engine.generate(prompt, StopCondition(args.max_new_tokens, eos)).accept_lengths
            timer.restore()
            vocabulary = drafter.vocab.size if hasattr(drafter, "vocab") else model.config.vocab_size
            print(f"{method:8} {vocabulary:>10} {1000 * statistics.median(timer.propose_times):>10.1f} "
                  f"{1000 * statistics.median(timer.forward_times):>9.1f} {sum(accepted) / len(accepted):>6.2f}"
                  + (f"  mean ms per propose: {breakdown(timer)}" if args.breakdown else ""), flush=True)


if __name__ == "__main__":
    main()
