"""Shared fixtures: a tiny randomly initialised Llama (fast tier) and the real SmolLM2 (marked `real_model`)."""
from __future__ import annotations

import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.engine import SpeculativeEngine, StopCondition

VOCAB = 96


def make_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    """A 2-layer Llama with large random weights so its argmax has no near-ties; float64 rules out rounding flips."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.5, eos_token_id=None,
        bos_token_id=None, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    return model


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session")
def prompts():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (5, 17, 40)]


def vanilla_tokens(model, prompt: list[int], max_new_tokens: int, eos: frozenset[int] = frozenset()) -> list[int]:
    return SpeculativeEngine(model).generate(prompt, StopCondition(max_new_tokens, eos)).tokens


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


def tiny_overrides(checkpoint, out_dir) -> list[str]:
    """Overrides that point the CLI's config at the tiny checkpoint, on CPU, with short generations."""
    return [f"model.path={checkpoint}", "model.gguf_file=null", "model.package=null", "model.name=tiny",
            "model.dtype=float64", "device=cpu", f"out_dir={out_dir}", "gen.max_new_tokens=12", "warmup_tokens=2"]


@pytest.fixture
def compose(tiny_checkpoint, tmp_path):
    """compose(*overrides) -> the CLI's config for the tiny checkpoint, writing to a fresh out_dir."""
    from bench.run import compose_config

    def _compose(*overrides: str):
        return compose_config(*tiny_overrides(tiny_checkpoint, tmp_path / "run"), *overrides)

    return _compose


@functools.cache
def load_smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct on CPU, in its configured dtype; loaded once per session."""
    from omegaconf import OmegaConf

    from bench.models import load_model
    from bench.run import PROJECT_ROOT

    return load_model(OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml"), torch.device("cpu"))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2 (see load_smollm2)."""
    return load_smollm2()


@pytest.fixture
def one_thread():
    """Tiny-model forwards take milliseconds; extra intra-op threads only add contention on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def spec_bench_prompts(tokenizer, category: str, count: int) -> list[list[int]]:
    """First-turn prompts of the first `count` Spec-Bench questions of a category, through the chat template."""
    from tasks import first_turn_prompts, read_questions

    return first_turn_prompts(tokenizer, read_questions([category])[:count])
