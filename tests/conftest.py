"""Shared fixtures: tiny randomly initialised models, Llama and sliding-window ones (fast tier), and the real SmolLM2
(marked `real_model`); the independent oracle, transformers' `generate`."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from bench.engine.loop import SpeculativeEngine, StopCondition

# Tests assert behaviour, not speed, on models whose forwards take milliseconds: one intra-op thread (also for the
# CLI subprocesses) is as fast on a quiet machine and keeps a busy one from stalling at OpenMP's barriers, where two
# threads wait for each other's turn on a shared core (tools/busy.sh).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

VOCAB = 96
WINDOW = 4  # attention window of the windowed tiny models, shorter than every test prompt
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.5)
ARCHITECTURES = {  # name: (config class, model class, extra config)
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": WINDOW}),  # every layer windowed
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM,  # windowed and full layers
               {"sliding_window": WINDOW, "head_dim": 16, "layer_types": ["sliding_attention", "full_attention"]}),
}


def tiny_config(arch: str = "llama", **overrides):
    config_class, _, extra = ARCHITECTURES[arch]
    return config_class(**{**TINY, **extra, **overrides})


def make_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64, arch: str = "llama"):
    """A 2-layer model with large random weights so its argmax has no near-ties; float64 rules out rounding flips."""
    torch.manual_seed(seed)
    config = tiny_config(arch, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return ARCHITECTURES[arch][1](config).to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session", params=["mistral", "gemma3"])
def windowed_model(request):
    """Tiny models with sliding-window attention (window WINDOW): Mistral-style (every layer) and Gemma-3-style
    (one windowed, one full layer)."""
    return make_tiny_model(arch=request.param)


@pytest.fixture(scope="session")
def prompts():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (5, 17, 40)]


def vanilla_tokens(model, prompt: list[int], max_new_tokens: int, eos: frozenset[int] = frozenset()) -> list[int]:
    return SpeculativeEngine(model).generate(prompt, StopCondition(max_new_tokens, eos)).tokens


@torch.inference_mode()
def generate_tokens(model, prompt: list[int], max_new_tokens: int, eos: frozenset[int] = frozenset()) -> list[int]:
    """The independent oracle: transformers' own greedy `generate` (its own cache and masks), with a fresh generation
    config so that nothing but `eos` stops it early."""
    eos_ids = sorted(eos) or None
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_ids,
                              pad_token_id=eos_ids[0] if eos_ids else None)
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory):
    """A tiny base model without a chat template, with sliding-window attention (see tests/tiny_checkpoint.py)."""
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-gemma3"), base_model=True)


def tiny_overrides(checkpoint, out_dir) -> list[str]:
    """Overrides that point the CLI's config at the tiny checkpoint, on CPU, with short generations."""
    return [f"model.path={checkpoint}", "model.gguf_file=null", "model.package=null", "model.name=tiny",
            "model.dtype=float64", "device=cpu", f"out_dir={out_dir}", "gen.max_new_tokens=12", "warmup_tokens=2",
            f"profile.dir={Path(out_dir).parent / 'profiles'}", "profile.lengths=[1,2,4,8]", "profile.contexts=[16,64]",
            "profile.repeats=1"]


def folder_stem(out_dir: str) -> str:
    """A default out_dir without its settings label (`-1024tok-3fa9c1`: bench/run_folder.py)."""
    return re.sub(r"-\d+tok(-t[0-9.]+-s\d+)?-[0-9a-f]{6}$", "", out_dir)


@pytest.fixture
def compose(tiny_checkpoint, tmp_path):
    """compose(*overrides) -> the CLI's config for the tiny checkpoint, writing to a fresh out_dir."""
    from bench.config import compose_config

    def _compose(*overrides: str, checkpoint=tiny_checkpoint):
        return compose_config(*tiny_overrides(checkpoint, tmp_path / "run"), *overrides)

    return _compose


@functools.cache
def load_smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct on CPU, in its configured dtype; loaded once per session."""
    from omegaconf import OmegaConf

    from bench.artifacts import PROJECT_ROOT
    from bench.models import load_model

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

    questions = read_questions([category])[:count]
    assert questions, f"no Spec-Bench questions of category {category!r}"
    return first_turn_prompts(tokenizer, questions)


def assert_acceptance_records_match(out_dir: Path) -> list[dict]:
    """The run's acceptance.jsonl (invariants checked on reading) holds one record per turn of its answers, with the
    same decode steps and tokens; returns them."""
    from bench.measure.acceptance import read_acceptance
    from bench.records import read_jsonl

    answers = sorted(read_jsonl(Path(out_dir) / "answers.jsonl"), key=lambda a: a["question_id"])
    requests = read_acceptance(Path(out_dir) / "acceptance.jsonl")
    turns = [(a["question_id"], t, a["choices"][0]) for a in answers for t in range(len(a["choices"][0]["turns"]))]
    assert [r["request_id"] for r in requests] == [f"{q}-{t}" for q, t, _ in turns]
    for request, (_, t, choice) in zip(requests, turns):
        assert request["completion_tokens"] == choice["new_tokens"][t]
        assert request["num_decode_steps"] == choice["decoding_steps"][t]
    return requests
