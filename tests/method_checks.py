"""Helpers shared by the per-method tests: lossless checks on the tiny model and on the real SmolLM2, configs."""
from __future__ import annotations

import functools
import json

import pytest
import torch
from omegaconf import OmegaConf

from bench.engine import SpeculativeEngine, StopCondition
from bench.run import PROJECT_ROOT, eos_token_ids
from tasks import QUESTIONS_FILE, build_prompt
from tests.conftest import vanilla_tokens


@pytest.fixture
def one_thread():
    """Tiny-model forwards take milliseconds; extra intra-op threads only add contention on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_lossless(model, drafter, prompt: list[int], max_new_tokens: int, eos=frozenset()):
    """The drafter's greedy output equals plain decoding, token for token; returns the engine's TurnOutput."""
    out = SpeculativeEngine(model, drafter).generate(prompt, StopCondition(max_new_tokens, frozenset(eos)))
    assert out.tokens == vanilla_tokens(model, prompt, max_new_tokens, frozenset(eos))
    return out


@functools.cache
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M in float32 (bfloat16 rounding can flip near-tied argmaxes)."""
    from bench.models import load_model

    cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml")
    cfg.dtype = "float32"
    return load_model(cfg, torch.device("cpu"))


def chat_prompts(tokenizer, category: str, count: int) -> list[list[int]]:
    """First-turn prompts of the first `count` Spec-Bench questions of a category."""
    questions = [json.loads(line) for line in QUESTIONS_FILE.read_text().splitlines()]
    picked = [q for q in questions if q["category"] == category][:count]
    return [build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in picked]


def assert_lossless_on_smollm2(method, *overrides: str, category: str = "summarization", count: int = 2,
                               max_new_tokens: int = 48) -> float:
    """A drafter equals vanilla on real prompts; returns its mean accepted tokens per target forward.

    method: a conf/method name (its drafter built as the runner builds it, with Hydra `overrides`) or a callable
    make_drafter(model, tokenizer).
    """
    model, tokenizer = smollm2()
    eos = frozenset(eos_token_ids(model, tokenizer))
    accepted = []
    for prompt in chat_prompts(tokenizer, category, count):
        if isinstance(method, str):
            drafter = drafter_from_config(method, model, tokenizer, *overrides)
        else:
            drafter = method(model, tokenizer)
        out = SpeculativeEngine(model, drafter).generate(prompt, StopCondition(max_new_tokens, eos))
        assert out.tokens == smollm2_vanilla(tuple(prompt), max_new_tokens)
        accepted += out.accept_lengths
    return sum(accepted) / len(accepted)


@functools.cache
def smollm2_vanilla(prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """SmolLM2's greedy tokens for a prompt, computed once per test session."""
    model, tokenizer = smollm2()
    return vanilla_tokens(model, list(prompt), max_new_tokens, frozenset(eos_token_ids(model, tokenizer)))


def compose_method(name: str, *overrides: str):
    """The full run config (conf/config.yaml) with method=<name>, as `python -m bench` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"method={name}", *overrides])


def drafter_from_config(name: str, model, tokenizer, *overrides: str):
    """The drafter of conf/method/<name>.yaml, built as the runner builds it."""
    from bench.run import build_drafter
    from bench.sampling import SamplingConfig

    return build_drafter(compose_method(name, *overrides).method, model, tokenizer, SamplingConfig())
