"""Load the target model and tokenizer named by a `conf/model/*.yaml` config."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from bench.artifacts import cache_dir, package_dir, partial_folder, publish_folder
from bench.errors import ConfigError, MissingArtifactError
from bench.model_parts import assembled_folder
from tasks.prompts import set_prompt_format

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


BFLOAT16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with bfloat16 matrix instructions


def bfloat16_flags(cpuinfo: str) -> list[str]:
    """The bfloat16 matrix instruction sets (BFLOAT16_CPU_FLAGS) named in a /proc/cpuinfo text's flags lines."""
    flag_lines = [line.split(":", 1)[1] for line in cpuinfo.splitlines() if line.startswith("flags")]
    flags = {flag for line in flag_lines for flag in line.split()}
    return [flag for flag in BFLOAT16_CPU_FLAGS if flag in flags]


def cpu_bfloat16_support(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """This CPU's bfloat16 matrix instruction sets among BFLOAT16_CPU_FLAGS (empty: none, or not Linux)."""
    try:
        return bfloat16_flags(cpuinfo.read_text())
    except OSError:
        return []


def check_dtype_supported(cfg: DictConfig, device: torch.device, support: list[str] | None = None) -> None:
    """Refuse bfloat16 on a CPU without AMX-BF16 or AVX512-BF16: there a forward over 16 tokens costs ~7x one token
    (measured on an AVX2 EPYC; 1.2x with AMX), so speculation is measured in a regime no user runs.
    `model.allow_slow_bfloat16=true` runs anyway (tests on tiny models do)."""
    if device.type != "cpu" or cfg.dtype != "bfloat16" or cfg.get("allow_slow_bfloat16", False):
        return
    if not (cpu_bfloat16_support() if support is None else support):
        raise ConfigError("model.dtype=bfloat16: this CPU has neither AMX-BF16 nor AVX512-BF16 (/proc/cpuinfo flags "
                          "amx_bf16, avx512_bf16), so bfloat16 here is slower than float32 and speculation's "
                          "verification ~7x a token; use model.dtype=float32 (model=smollm2_135m), or "
                          "+model.allow_slow_bfloat16=true to run anyway")


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MissingArtifactError(f"device={name} was asked for but torch sees no CUDA device; use device=cpu or "
                                   f"device=auto")
    return torch.device(name)


def eos_token_ids(model, tokenizer) -> set[int]:
    """EOS ids as `generate` uses them: the generation config's, else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) - {None}


def model_folder(model: DictConfig) -> Path:
    """The folder holding a model's files: its installed package's (model.package), the cache folder of its
    assembled parts (model.parts: bench/model_parts.py), else model.path."""
    if model.get("package"):
        return package_dir(model.package, model.install_hint)
    if model.get("parts"):
        return assembled_folder(model)
    return Path(model.path)


def dequantized_gguf(cfg: DictConfig) -> Path:
    """A plain float32 safetensors copy of the configured GGUF model, made on first use.

    Dequantizing the GGUF takes ~15 s on every load; the copy loads in about a second.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = model_folder(cfg)
    gguf = directory / cfg.gguf_file
    if not gguf.exists():
        raise MissingArtifactError(f"GGUF file {gguf} not found; fix: {cfg.install_hint}")
    out = cache_dir() / "models" / f"{gguf.stem}-{gguf.stat().st_size}"
    if (out / "model.safetensors").exists():
        return out
    print(f"dequantizing {gguf.name} once into {out}", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=cfg.gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=cfg.gguf_file)
    tmp = partial_folder(out)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.config.quantization_config = None
    del model.config.quantization_config
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    return publish_folder(tmp, out)


def context_window(model) -> int | None:
    """The most positions (prompt + generated tokens) the model was built for; None when its config does not say."""
    return getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)


def load_model(cfg: DictConfig, device: torch.device):
    """Return (model, tokenizer) in eval mode on `device` with the configured dtype and attention implementation;
    the weights are loaded onto the device directly (device_map) where accelerate is installed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import is_accelerate_available

    check_dtype_supported(cfg, device)
    source = dequantized_gguf(cfg) if cfg.get("gguf_file") else cfg.path
    placement = {"device_map": device} if is_accelerate_available() else {}  # weights straight onto the device
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.get("attn_implementation", "sdpa"), **placement
        )
    except OSError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MissingArtifactError(f"cannot load model '{source}' ({reason}); fix: {cfg.install_hint}") from err
    prompt_format = set_prompt_format(tokenizer, cfg.get("prompt_format", "auto"), cfg.get("chat_template"))
    if prompt_format == "plain" and cfg.get("prompt_format", "auto") == "auto":
        print(f"warning: model '{cfg.name}' has no chat template; prompts use the plain format "
              f"('User: ...\\n\\nAssistant:', docs/models.md: Prompts); set model.chat_template=... or "
              f"model.prompt_format=raw "
              f"to change it", file=sys.stderr)
    if not placement:  # without accelerate transformers loads on the CPU; copy it over
        model.to(device)
    model.eval()
    return model, tokenizer


def load_check_model(cfg: DictConfig, device: torch.device, dtype: str | None):
    """A copy of the target in `dtype` (model.tie_check_dtype) to re-check divergences at, or None when that is the
    run's own dtype (or null): the float32 judge of a bfloat16 run's numeric ties."""
    if dtype is None or dtype == cfg.dtype:
        return None
    model, _ = load_model(OmegaConf.merge(cfg, {"dtype": dtype}), device)
    return model


def load_tokenizer(model_cfg):
    """The tokenizer of a `conf/model/*.yaml` model, without loading its weights."""
    from transformers import AutoTokenizer

    if model_cfg.get("gguf_file"):
        source = model_folder(model_cfg)
        return AutoTokenizer.from_pretrained(source, gguf_file=model_cfg.gguf_file)
    return AutoTokenizer.from_pretrained(model_cfg.path)
