"""Helpers shared by the per-method tests: lossless checks on the tiny model and on the real SmolLM2, configs."""
from __future__ import annotations

import functools

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.tree import first_nodes
from bench.models import eos_token_ids
from tests.conftest import generate_tokens, load_smollm2, spec_bench_prompts, vanilla_tokens


def assert_lossless(model, drafter, prompt: list[int], max_new_tokens: int, eos=frozenset()):
    """The drafter's greedy output equals plain decoding and transformers' `generate`, token for token; returns
    the engine's TurnOutput."""
    out = SpeculativeEngine(model, drafter).generate(prompt, StopCondition(max_new_tokens, frozenset(eos)))
    assert out.tokens == vanilla_tokens(model, prompt, max_new_tokens, frozenset(eos))
    assert out.tokens == generate_tokens(model, prompt, max_new_tokens, frozenset(eos))
    return out


def assert_first_nodes_drafted_alike(model, drafter, prompt: list[int], max_new_tokens: int) -> int:
    """Decodes `prompt` losslessly with `drafter` (one whose proposals keep no state from call to call), checking at
    every step that propose_first(k), which drafts only what the first k nodes need, is the whole tree's first k
    nodes, token for token and parent for parent, for every k; returns how many (step, k) it checked."""
    whole_tree, checked = drafter.propose, []

    def propose(context, max_tokens):
        whole = whole_tree(context, max_tokens)
        for k in range(1, 0 if whole is None else len(whole) + 1):
            first, expected = drafter.propose_first(context, max_tokens, k), first_nodes(whole, k)
            assert (list(first.tokens), first.parents) == (list(expected.tokens), expected.parents)
            checked.append(k)
        return whole

    drafter.propose = propose
    assert_lossless(model, drafter, prompt, max_new_tokens)
    return len(checked)


def assert_lossless_on_smollm2(method, *overrides: str, category: str = "summarization", count: int = 2,
                               max_new_tokens: int = 48) -> float:
    """A drafter equals vanilla on real prompts; returns its mean accepted tokens per target forward.

    method: a conf/method name (its drafter built as the runner builds it, with Hydra `overrides`) or a callable
    make_drafter(model, tokenizer).
    """
    model, tokenizer = load_smollm2()
    eos = frozenset(eos_token_ids(model, tokenizer))
    drafter = (drafter_from_config(method, model, tokenizer, *overrides) if isinstance(method, str)
               else method(model, tokenizer))
    engine = SpeculativeEngine(model, drafter)  # one drafter for every prompt, as the runner does
    accepted = []
    for prompt in spec_bench_prompts(tokenizer, category, count):
        out = engine.generate(prompt, StopCondition(max_new_tokens, eos))
        assert out.tokens == smollm2_vanilla(tuple(prompt), max_new_tokens)
        accepted += out.accept_lengths
    return sum(accepted) / len(accepted)


@functools.cache
def smollm2_vanilla(prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """SmolLM2's greedy tokens for a prompt, computed once per test session."""
    model, tokenizer = load_smollm2()
    return vanilla_tokens(model, list(prompt), max_new_tokens, frozenset(eos_token_ids(model, tokenizer)))


def compose_method(name: str, *overrides: str):
    """The full run config (conf/config.yaml) with method=<name>, as `python -m bench` composes it."""
    return compose_config(f"method={name}", *overrides)


def drafter_from_config(name: str, model, tokenizer, *overrides: str):
    """The drafter of conf/method/<name>.yaml, built as the runner builds it."""
    from bench.engine.sampling import SamplingConfig
    from bench.measure.assemble import build_drafter
    from bench.settings import drafter_settings

    return build_drafter(drafter_settings(compose_method(name, *overrides).method), model, tokenizer,
                         SamplingConfig())


def assert_sizing_auto_run_lossless(compose, tmp_path, method: str, batch_size: int, *overrides: str) -> None:
    """`python -m bench method=<method> method.sizing=auto` with `overrides` (the head or draft folder for the tiny
    target), two qa questions at `batch_size`: every answer equals vanilla's, labelled <method>+auto."""
    from bench.measure.run import run
    from bench.records import read_jsonl

    run(compose(f"method={method}", "method.sizing=auto", *overrides, "task=qa", "task.limit=2",
                f"gen.batch_size={batch_size}"))
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert len(answers) == 2 and all(a["exact_match"] for a in answers)
    assert {a["method"] for a in answers} == {f"{method}+auto"}
