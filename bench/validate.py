"""The typed boundary: a composed config checked before anything is loaded, one line per bad value naming the key
and what it accepts (drafter knobs included), then turned into bench.settings.RunSettings."""
from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bench import SIZINGS
from bench.errors import ConfigError
from bench.knobs import knob_problems
from bench.models import DTYPES
from bench.settings import COMPILE_FROM_TOKENS, RunSettings
from bench.tracking import MISSING, TRACKINGS, mlflow_installed
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
    ("engine.compile", lambda v: v in ("auto", "off", "on"),
     f"auto, off or on (on: compiled forwards over a static cache; auto: on for answers of {COMPILE_FROM_TOKENS} "
     f"tokens or more)"),
    ("gen.batch_size", lambda v: _integer(v) and 1 <= v <= MAX_BATCH_SIZE,
     f"an integer >= 1, at most {MAX_BATCH_SIZE} (a batch larger than the task's questions is cut to them)"),
    ("model.attn_implementation", lambda v: v in ATTENTION_IMPLEMENTATIONS,
     " or ".join(ATTENTION_IMPLEMENTATIONS) + " (flash attention ignores the 4-D tree masks verification needs)"),
    ("tracking", lambda v: v in TRACKINGS, " or ".join(TRACKINGS) + " (mlflow: log the finished run to MLflow)"),
    ("tracking_uri", lambda v: v is None or (isinstance(v, str) and v != ""),
     "an MLflow tracking URI, or null for a local mlruns/ folder"),
]
_ABSENT = object()


def drafter_problems(method: DictConfig) -> list[str]:
    """One line per bad knob of `method.drafter` (bench.knobs: unknown, of the wrong type, out of range); none for
    vanilla."""
    if method.get("drafter") is None:
        return []
    unset = sorted(OmegaConf.missing_keys(method.drafter))
    if unset:  # `???` in conf/method/<m>.yaml: a per-model setting (a checkpoint) this model has no file for
        return [f"{key}: not set for this model; set it on the command line ({key}=...) or in "
                f"conf/method_model/{method.get('name')}/<model>.yaml" for key in unset]
    try:
        knobs = OmegaConf.to_container(method.drafter, resolve=True)
    except OmegaConfBaseException as err:
        return [f"method.drafter: {str(err).splitlines()[0]}"]
    target = knobs.pop("_target_", None)
    try:
        drafter = get_class(target)
    except Exception as err:  # noqa: BLE001 - any failure to import it is the same mistake
        return [f"method.drafter._target_={target}: not an importable class ({str(err).splitlines()[0]})"]
    return knob_problems(drafter, knobs)


def validate(cfg: DictConfig) -> RunSettings:
    """The run's typed settings, or ConfigError listing every value of `cfg` that RULES or its drafter rejects."""
    problems = []
    for key, accepts, allowed in RULES:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and not accepts(value):
            problems.append(f"{key}={value}: must be {allowed}")
    if cfg.method.get("drafter") is None and cfg.method.get("sizing") == "auto":
        problems.append(f"method.sizing=auto: method={cfg.method.name} drafts nothing, so there is nothing to size")
    if cfg.get("tracking") == "mlflow" and not mlflow_installed():  # refused before the run, not after it
        problems.append(MISSING)
    problems += drafter_problems(cfg.method)
    if problems:
        raise ConfigError("\n".join(problems))
    return RunSettings.from_config(cfg)
