"""The parity protocol every parity file (bench/parity/methods/<method>.py) follows: both sides decode the same
prompt token ids (MT-bench questions, both turns, turn 2 asked after vanilla's turn-1 answer; our chat template),
greedily in float32 on the same target (SmolLM2-135M: the dequantized GGUF folder bench/models.py makes, which both
sides load), with the same settings, ours composed from conf/ as `python -m bench` composes them. A comparison row
gives, per prompt, each side's tokens and target forwards until they were known (#MAT: tokens per target forward, the
prefill included) and the first divergence as bench/measure finds it (with whether our float32 target calls it a
numeric tie)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import build_drafter
from bench.measure.exactness import find_divergence
from bench.models import eos_token_ids, load_model
from bench.parity.environments import side_model_dir
from bench.parity.sides.upstream_driver import forwards_until_done, running_sums, spec_bench_order
from bench.settings import DrafterSettings, drafter_settings
from tasks import read_questions
from tasks.prompts import build_prompt


@dataclasses.dataclass
class Setup:
    """What every row decodes: the float32 target, its tokenizer and model config, the prompts, where to stop; and
    where the upstream checkouts are (`--checkout name=DIR`, else their defaults)."""

    model_name: str
    model: object
    tokenizer: object
    model_cfg: object
    prompts: list[list[int]]
    stop: StopCondition
    checkouts: dict[str, str] = dataclasses.field(default_factory=dict)

    def knobs(self, method: str, upstream: bool = False) -> dict:
        """`method`'s drafter knobs as `python -m bench method=<method> model=<model>` composes them; upstream=True:
        conf/method/<method>.yaml's own (its upstream defaults, without the per-model settings)."""
        overrides = [f"method={method}", f"model={self.model_name}", *(["~method_model@method"] if upstream else [])]
        return drafter_settings(compose_config(*overrides).method).knobs

    def drafter(self, method: str, **knobs) -> Callable:
        """A factory of `method`'s drafter on the target, built as the harness builds it from its composed knobs,
        `knobs` replacing some (greedy)."""
        settings = drafter_settings(compose_config(f"method={method}", f"model={self.model_name}").method)
        settings = DrafterSettings(settings.target, {**settings.knobs, **knobs})
        return lambda: build_drafter(settings, self.model, self.tokenizer, SamplingConfig())

    def side_job(self) -> dict:
        """What a driver's job holds: the target's folder in transformers 4's spelling, the prompts, where to stop
        (the first EOS id) and how many tokens."""
        return {"model_dir": str(side_model_dir(self.model_cfg)), "eos": min(self.stop.eos_token_ids),
                "max_new_tokens": self.stop.max_new_tokens, "prompts": self.prompts}


def parity_setup(model_name: str, questions: list[int], max_new_tokens: int, checkouts: dict[str, str]) -> Setup:
    """The model in float32 and `questions`' prompts, both turns."""
    cfg = compose_config(f"model={model_name}", "model.dtype=float32").model
    model, tokenizer = load_model(cfg, torch.device("cpu"))
    eos = sorted(eos_token_ids(model, tokenizer))
    prompts = mt_bench_prompts(model, tokenizer, questions, max_new_tokens, eos)
    return Setup(model_name, model, tokenizer, cfg, prompts, StopCondition(max_new_tokens, frozenset(eos)), checkouts)


def mt_bench_prompts(model, tokenizer, question_ids: list[int], max_new_tokens: int, eos) -> list[list[int]]:
    """Both turns' prompt ids of each question; turn 2 follows vanilla's (= every lossless method's) turn-1 answer."""
    vanilla = SpeculativeEngine(model)
    prompts = []
    for question in (q for q in read_questions() if q["question_id"] in question_ids):
        conversation = []
        for turn in question["turns"]:
            conversation.append({"role": "user", "content": turn})
            prompt = build_prompt(tokenizer, conversation)
            prompts.append(prompt)
            answer = vanilla.generate(prompt, StopCondition(max_new_tokens, frozenset(eos))).tokens
            conversation.append({"role": "assistant",
                                 "content": tokenizer.decode(answer, skip_special_tokens=True).strip()})
    return prompts


@dataclasses.dataclass
class Comparison:
    """One row: per prompt, each side's (new tokens, target forwards until they were known); notes say more (per
    position acceptance, drafts compared step by step, ...)."""

    method: str
    settings: str
    ours: list[tuple[list[int], int]]
    theirs: list[tuple[list[int], int]]
    notes: list[str] = dataclasses.field(default_factory=list)

    def mats(self) -> tuple[float, float]:
        """(our #MAT, upstream's)."""
        return tuple(sum(len(t) for t, _ in side) / sum(f for _, f in side) for side in (self.ours, self.theirs))

    def divergence(self, setup: Setup | None = None) -> dict | None:
        """bench/measure's find_divergence of our tokens from upstream's (None: equal); with a `setup`, whether its
        target calls the first difference a numeric tie (conf/model tie_margin)."""
        prompts = setup.prompts if setup else [[]] * len(self.ours)
        turns = [{"token_ids": tokens, "prompt_ids": prompt} for (tokens, _), prompt in zip(self.ours, prompts)]
        return find_divergence(setup.model if setup else None, turns,
                               {"choices": [{"token_ids": [tokens for tokens, _ in self.theirs]}]},
                               setup.model_cfg.tie_margin if setup else 0.0)

    def record(self, setup: Setup | None = None) -> dict:
        """The row as a record (results/reference/parity/<model>/parity.csv)."""
        ours, theirs = self.mats()
        found = self.divergence(setup) or {}
        return {"method": self.method, "settings": self.settings, "prompts": len(self.ours),
                "our_mat": round(ours, 4), "upstream_mat": round(theirs, 4),
                "difference": round((ours - theirs) / theirs, 4), "tokens_equal": not found,
                "divergence_prompt": found.get("turn"), "divergence_token": found.get("position"),
                "numeric_tie": found.get("numeric_tie"), "tie_distance": found.get("tie_distance"),
                "notes": " | ".join(self.notes)}

    def line(self, record: dict | None = None) -> str:
        """The row in the printed table."""
        row = record or self.record()
        return (f"| {self.method} | {self.settings} | {row['our_mat']:.3f} | {row['upstream_mat']:.3f} | "
                f"{row['difference']:+.1%} | {tokens_equal(row)} |")


def tokens_equal(record: dict) -> str:
    """`yes`, or where a row's tokens first differ: `no (prompt p, token t)`."""
    return "yes" if record["tokens_equal"] else \
        f"no (prompt {record['divergence_prompt']}, token {record['divergence_token']})"


def decode_step_lengths(out) -> list[int]:
    """Tokens each decode step added: TurnOutput.accept_lengths, less the prefill's entry where it books one (the
    prefill's token counted as a step, before issue 42's Spec-Bench counting)."""
    lengths = out.accept_lengths
    return lengths[1:] if sum(lengths) == len(out.tokens) else lengths


def counted_output(out, max_new_tokens: int) -> tuple[list[int], int]:
    """(tokens up to max_new_tokens, target forwards until they were known: the prefill, then the decode steps) of
    one of our engine's TurnOutputs."""
    tokens = out.tokens[:max_new_tokens]
    return tokens, forwards_until_done(running_sums(decode_step_lengths(out), start=1), tokens)


def counted_outputs(setup: Setup, outputs: list) -> list[tuple[list[int], int]]:
    """counted_output of each of our engine's TurnOutputs."""
    return [counted_output(out, setup.stop.max_new_tokens) for out in outputs]


def counted_steps(runs: list[dict]) -> list[tuple[list[int], int]]:
    """(tokens, target forwards until they were known) of a side's runs ({"tokens", "steps": tokens per decode
    step}, the prefill having made the first token known)."""
    return [(r["tokens"], forwards_until_done(running_sums(r["steps"], start=1), r["tokens"])) for r in runs]


def engine_outputs(setup: Setup, make_drafter: Callable) -> list:
    """Our engine's TurnOutput of each of `setup`'s prompts, a fresh drafter (make_drafter()) for each."""
    return [SpeculativeEngine(setup.model, make_drafter()).generate(p, setup.stop) for p in setup.prompts]


def sequential_outputs(setup: Setup, make_drafter: Callable, warmup: int, decode_past: int = 0) -> list:
    """Our engine's TurnOutput of each prompt with one drafter through Spec-Bench's sequence (`warmup` times both
    turns of the first question, left out, then every prompt): upstream's drafters keep state across prompts.
    `decode_past` more tokens are decoded past max_new_tokens, as upstream's loop does (what the drafter learns from
    them carries over)."""
    engine = SpeculativeEngine(setup.model, make_drafter())
    longer = dataclasses.replace(setup.stop, max_new_tokens=setup.stop.max_new_tokens + decode_past)
    return [out for counted, out in ((counted, engine.generate(p, longer))
                                     for counted, p in spec_bench_order(setup.prompts, warmup)) if counted]


def knob_text(knobs: dict, prefix: str = "") -> str:
    """`knobs` as the overrides that set them; a list (a tree's choices) by its size."""
    def value(v):
        return f"<{len(v)} choices>" if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else v
    return " ".join(f"{prefix}{name}={value(v)}" for name, v in knobs.items())


def acceptance_shares(step_lengths: list[list[int]], positions: int) -> str:
    """Per draft position i (1..positions): the share of steps (tokens each step added, the bonus token included)
    that accepted at least i drafts, as "a / b / ..."."""
    steps = [n - 1 for lengths in step_lengths for n in lengths]
    return " / ".join(f"{sum(n >= i for n in steps) / max(len(steps), 1):.3f}" for i in range(1, positions + 1))


def acceptance_note(label: str, ours: list, their_steps: list[list[int]], positions: int, upstream: str) -> str:
    """`label`: acceptance_shares of our TurnOutputs beside upstream's (its tokens per step, per prompt)."""
    return (f"{label}: steps accepting >= {' / '.join(map(str, range(1, positions + 1)))} drafts: ours "
            f"{acceptance_shares([decode_step_lengths(o) for o in ours], positions)}, {upstream} "
            f"{acceptance_shares(their_steps, positions)}")


def generate_recording(engine, drafter, prompt: list[int], stop, search: str, keep=lambda length: True):
    """(engine.generate's output, {new tokens known: the sequences drafted there}): what the drafter's `search`
    method (called as search(root, length), returning a tensor of token sequences) gave where `keep(length)`."""
    drafted, known, inner = {}, {"now": 0}, getattr(drafter, search)

    def propose(context: list[int], max_tokens: int):
        known["now"] = len(context) - len(prompt)
        return type(drafter).propose(drafter, context, max_tokens)

    def recording(root: int, length: int):
        sequences = inner(root, length)
        if keep(length):
            drafted[known["now"]] = sequences.tolist()
        return sequences

    drafter.propose = propose
    setattr(drafter, search, recording)
    try:
        out = engine.generate(prompt, stop)
    finally:
        del drafter.propose
        delattr(drafter, search)
    return out, drafted
