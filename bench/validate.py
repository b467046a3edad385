"""Settings checked before anything is loaded: one line per bad value, naming the key and what it accepts."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bench import DEPRECATED_SIZING, SIZINGS, deprecated_meaning
from bench.errors import ConfigError
from bench.models import DTYPES
from tasks.prompts import PROMPT_FORMATS


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _device(value) -> bool:
    import torch

    if value == "auto":
        return True
    try:
        return torch.device(value).type in ("cpu", "cuda", "mps")
    except (RuntimeError, TypeError):
        return False


MAX_BATCH_SIZE = 1024  # sanity bound: each row holds its own KV cache
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # those that honour the engine's 4-D attention masks


# key, test, what the key accepts. Keys absent from a config (older model YAMLs, say) are not checked.
RULES = [
    ("gen.temperature", lambda v: _real(v) and v >= 0, "a number >= 0 (0 = greedy)"),
    ("gen.top_p", lambda v: _real(v) and 0 < v <= 1, "a number in (0, 1] (1 = no top-p filter)"),
    ("gen.top_k", lambda v: _integer(v) and v >= 0, "an integer >= 0 (0 = no top-k filter)"),
    ("gen.max_new_tokens", lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    ("task.limit", lambda v: v is None or (_integer(v) and v >= 1), "an integer >= 1, or null for every question"),
    ("repeats", lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    ("warmup_tokens", lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    ("model.dtype", lambda v: v in DTYPES, "one of " + ", ".join(DTYPES)),
    ("device", _device, "auto, cpu, cuda, cuda:N or mps"),
    ("model.prompt_format", lambda v: v in PROMPT_FORMATS, "one of " + ", ".join(PROMPT_FORMATS)),
    ("method.sizing", lambda v: v in SIZINGS, " or ".join(SIZINGS)),
    *((f"method.{key}", lambda v, meaning=tuple(meaning): v is None or v in meaning,
       " or ".join(meaning) + " (deprecated: method.sizing)") for key, meaning in DEPRECATED_SIZING.items()),
    ("gen.batch_size", lambda v: _integer(v) and 1 <= v <= MAX_BATCH_SIZE,
     f"an integer >= 1, at most {MAX_BATCH_SIZE} (a batch larger than the task's questions is cut to them)"),
    ("model.attn_implementation", lambda v: v in ATTENTION_IMPLEMENTATIONS,
     " or ".join(ATTENTION_IMPLEMENTATIONS) + " (flash attention ignores the 4-D tree masks verification needs)"),
]
_ABSENT = object()


def _sizing_asked(method: DictConfig) -> list[tuple[str, str]]:
    """(key, value) of each spelling of method.sizing=auto that `method` sets (sizing, or a deprecated one)."""
    asked = [("sizing", method.get("sizing"))] if method.get("sizing") == "auto" else []
    return asked + [(key, method.get(key)) for key in DEPRECATED_SIZING if deprecated_meaning(method, key) == "auto"]


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError listing every value of `cfg` that RULES rejects."""
    problems = []
    for key, accepts, allowed in RULES:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and not accepts(value):
            problems.append(f"{key}={value}: must be {allowed}")
    if cfg.method.get("drafter") is None:
        problems += [f"method.{key}={value}: method={cfg.method.name} drafts nothing, so there is nothing to size"
                     for key, value in _sizing_asked(cfg.method)]
    if problems:
        raise ConfigError("\n".join(problems))
