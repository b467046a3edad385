"""Per-call draft cost and acceptance of the trained-head methods, with the draft-vocabulary slice and without it.

    python -m studies.draft_cost [--methods medusa eagle2 hydra] [--questions 4] [--max-new-tokens 96]
    python -m studies.draft_cost --model smollm2_135m_bf16 --methods eagle2 eagle3 --breakdown
    python -m studies.draft_cost --model smollm2_135m_bf16 --methods eagle2 --breakdown \
        --set method.drafter.total_token=16 method.drafter.depth=4 method.drafter.top_k=4

`--breakdown` (the configured vocabulary only) splits one `propose` call into the forwards of the drafter's modules
(head, heads, vocabulary projection, draft model, embeddings; mean ms per call) and the rest: top-k, tree and mask
building, host reads, Python. `--set` gives every method Hydra overrides (another tree, say).

Runs each method's default drafter (conf/method/<m>.yaml on SmolLM2) twice on the same first turns: once as
configured (logits over the checkpoint's frequency-ranked slice of the target's LM head) and once with the full
vocabulary (the same heads projected through the whole LM head). Reports the median wall time of one `propose`
call, the median target verification forward for comparison, and mean accepted tokens. Time it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import Module, ModuleList

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.models import eos_token_ids, load_model
from bench.settings import drafter_settings
from methods.eagle3.head import Eagle3Vocabulary
from methods.heads.common import DraftVocabulary
from tasks import first_turn_prompts, read_questions

DRAFTER_MODULES = ("head", "heads", "vocab", "draft", "embed")


class ModuleClock:
    """Wall time of the calls of a group of modules made inside `propose`: a call nested in another of the group
    (a child inside its parent) counts once."""

    def __init__(self, modules: list[Module], proposing: Callable[[], bool]):
        self.times: list[float] = []
        self.depth, self.started, self.proposing = 0, 0.0, proposing
        for module in modules:
            module.register_forward_pre_hook(self._enter)
            module.register_forward_hook(self._leave)

    def _enter(self, *_) -> None:
        if self.depth == 0:
            self.started = time.perf_counter()
        self.depth += 1

    def _leave(self, *_) -> None:
        self.depth -= 1
        if self.depth == 0 and self.proposing():
            self.times.append(time.perf_counter() - self.started)


def drafter_modules(drafter) -> dict[str, list[Module]]:
    """The modules the breakdown times, by name: each DRAFTER_MODULES attribute of the drafter that is a module, with
    the items of its module lists (Medusa's and Hydra's heads are called through their blocks, not their forward);
    EAGLE-3's vocabulary, no module, is its head's final norm and LM head, timed as `vocab` and not as `head`."""
    vocab = getattr(drafter, "vocab", None)
    named = {"vocab": [vocab.head.norm, vocab.head.lm_head]} if isinstance(vocab, Eagle3Vocabulary) else {}
    claimed = {id(m) for modules in named.values() for m in modules}
    for name in DRAFTER_MODULES:
        module = getattr(drafter, name, None)
        if name not in named and isinstance(module, Module):
            items = [item for child in module.children() if isinstance(child, ModuleList) for item in child]
            named[name] = [m for m in (module, *items) if id(m) not in claimed]
    return named


class Timed:
    """Wraps a drafter's propose and the target's forward with wall-clock timers, and times the drafter's modules
    inside propose (`drafter_modules`)."""

    def __init__(self, drafter, model):
        self.drafter, self.propose_times, self.forward_times = drafter, [], []
        self.proposing = False
        original_propose, original_forward = drafter.propose, model.forward

        def propose(*args, **kwargs):
            start, self.proposing = time.perf_counter(), True
            try:
                return original_propose(*args, **kwargs)
            finally:
                self.proposing = False
                self.propose_times.append(time.perf_counter() - start)

        def forward(*args, **kwargs):
            start = time.perf_counter()
            out = original_forward(*args, **kwargs)
            if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1 and "cache" in kwargs \
                    and kwargs["cache"].get_seq_length() > kwargs["input_ids"].shape[1]:
                self.forward_times.append(time.perf_counter() - start)
            return out

        drafter.propose, self.model, self._forward = propose, model, original_forward
        model.forward = forward
        self.module_clocks = {name: ModuleClock(modules, lambda: self.proposing)
                              for name, modules in drafter_modules(drafter).items()}

    def clear(self) -> None:
        for times in (self.propose_times, self.forward_times, *(c.times for c in self.module_clocks.values())):
            times.clear()

    def restore(self) -> None:
        self.model.forward = self._forward


def breakdown(timer: Timed) -> str:
    """Mean ms of one propose call, and of it in each drafter module and in the rest."""
    calls = len(timer.propose_times)
    mean = 1000 * sum(timer.propose_times) / calls
    per_module = {name: 1000 * sum(clock.times) / calls for name, clock in timer.module_clocks.items()}
    parts = {**per_module, "rest": mean - sum(per_module.values())}
    return f"mean ms per propose {mean:.1f}: " + "  ".join(f"{name} {ms:.1f}" for name, ms in parts.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m studies.draft_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml")
    parser.add_argument("--questions", type=int, default=4, help="first turns, spread over the questions")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--methods", nargs="+", default=["medusa", "eagle2", "hydra"])
    parser.add_argument("--breakdown", action="store_true", help="per-module split, configured vocabulary only")
    parser.add_argument("--set", nargs="+", default=[], metavar="OVERRIDE",
                        help="Hydra overrides for every method, e.g. method.drafter.total_token=16")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tokenizer = load_model(compose_config(f"model={args.model}").model, torch.device("cpu"))
    questions = read_questions()
    prompts = first_turn_prompts(tokenizer, questions[:: len(questions) // args.questions][: args.questions])
    eos = frozenset(eos_token_ids(model, tokenizer))
    print(f"{'method':8} {'vocabulary':>10} {'propose ms':>10} {'verify ms':>9} {'#MAT':>6}")
    for method in args.methods:
        for full in (False,) if args.breakdown else (False, True):
            cfg = compose_config(f"method={method}", f"model={args.model}", *args.set)
            drafter = build_drafter(drafter_settings(cfg.method), model, tokenizer, SamplingConfig())
            if full:
                drafter.vocab = DraftVocabulary(model.get_output_embeddings())
            timer = Timed(drafter, model)
            engine, accepted = SpeculativeEngine(model, drafter), []
            with torch.inference_mode():
                engine.generate(prompts[0], StopCondition(8, eos))  # warm-up
                timer.clear()
                for prompt in prompts:
                    accepted += engine.generate(prompt, StopCondition(args.max_new_tokens, eos)).accept_lengths
            timer.restore()
            vocabulary = drafter.vocab.size if hasattr(drafter, "vocab") else model.config.vocab_size
            print(f"{method:8} {vocabulary:>10} {1000 * statistics.median(timer.propose_times):>10.1f} "
                  f"{1000 * statistics.median(timer.forward_times):>9.1f} {sum(accepted) / len(accepted):>6.2f}"
                  + (f"  {breakdown(timer)}" if args.breakdown else ""), flush=True)


if __name__ == "__main__":
    main()
