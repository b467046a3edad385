"""A run's settings, typed: what `python -m bench` reads from its Hydra config, made once at the entry by
bench.validate.validate (which checks every value first) and read as fields from there on."""
from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from bench import method_label, sizing_of

# engine.compile=auto compiles a batch-1 run whose answers may reach this many tokens. Making a side's graphs takes
# seconds to a minute before timing and saves a share of every step (docs/running.md, "Compiled or eager"): shorter
# runs would spend more time compiling than it saves them. Batched runs stay eager: a graph of B rows takes about 30 s
# to make and saved 8-17% of a step (gen.batch_size=4, float32, 2026-12-06), so a run repays it only after tens of
# thousands of tokens.
COMPILE_FROM_TOKENS = 256


def compile_choice(config) -> tuple[bool, str]:
    """(compiled, why) for a composed config, live or meta.json's: engine.compile=on and off as asked; auto compiles a
    batch-1 run whose answers may reach COMPILE_FROM_TOKENS tokens, and `why` says what it chose in one line."""
    asked = (config.get("engine") or {}).get("compile", "off")
    if asked != "auto":
        return asked == "on", ""
    gen = config["gen"]
    if int(gen.get("batch_size", 1)) > 1:
        return False, (f"eager: a batch's graphs (gen.batch_size={gen['batch_size']}) take about half a minute each "
                       f"to make, more than they save a run (engine.compile=on compiles anyway)")
    tokens = int(gen["max_new_tokens"])
    if tokens < COMPILE_FROM_TOKENS:
        return False, (f"eager: answers of at most {tokens} tokens do not repay compiling, which takes tens of seconds "
                       f"a side (engine.compile=on compiles anyway)")
    return True, f"compiled: answers of up to {tokens} tokens repay compiling (engine.compile=off runs eager)"


@dataclass(frozen=True)
class Generation:
    """`gen.*`: how every question is decoded."""

    max_new_tokens: int
    batch_size: int = 1
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class ModelSettings:
    """`model.*` as the checks and the run's labels read it (bench.models.load_model reads the rest)."""

    name: str
    dtype: str
    attn_implementation: str = "sdpa"
    prompt_format: str = "auto"
    tie_margin: float = 0.0  # a divergence is a numeric tie when both tokens' logits lie this close to the top's
    tie_check_dtype: str | None = None  # the dtype whose copy of the target judges ties (None: the run's own)


@dataclass(frozen=True)
class TaskSettings:
    name: str
    limit: int | None = None  # first N questions of each task; None: all


@dataclass(frozen=True)
class DrafterSettings:
    """`method.drafter`: the drafter's class (Hydra `_target_`) and its knobs, resolved."""

    target: str
    knobs: dict = field(default_factory=dict)


def drafter_settings(method: DictConfig) -> DrafterSettings | None:
    """`method.drafter` of a method's config, resolved (None: vanilla, which drafts nothing)."""
    if method.get("drafter") is None:
        return None
    knobs = OmegaConf.to_container(method.drafter, resolve=True)
    return DrafterSettings(knobs.pop("_target_"), knobs)


@dataclass(frozen=True)
class MethodSettings:
    name: str
    sizing: str = "upstream"  # upstream | auto (conf/method/shared/speculation.yaml)
    drafter: DrafterSettings | None = None  # None: vanilla

    @property
    def label(self) -> str:
        """The method's name in records and reports (bench.method_label)."""
        return method_label(self.name, self.sizing)


@dataclass(frozen=True)
class Bootstrap:
    """`bootstrap.*`: the speedup's 95% interval, a paired bootstrap over questions."""

    samples: int = 2000
    seed: int = 0


@dataclass(frozen=True)
class RunSettings:
    """One `python -m bench` run (conf/config.yaml)."""

    generation: Generation
    model: ModelSettings
    task: TaskSettings
    method: MethodSettings
    backend: str = "engine"  # engine | server
    device: str = "auto"
    seed: int = 0
    out_dir: str = ""
    baseline: bool = True
    warmup_tokens: int = 16
    repeats: int = 1
    starvation_threshold: float = 0.75  # CPU share below which the run is starved
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    compiled: bool = False  # engine.compile, as compile_choice decides: the engine's compiled forwards
    tracking: str = "none"  # none | mlflow: the finished run logged to MLflow (bench/tracking.py)
    tracking_uri: str | None = None  # MLflow's tracking URI; None: ./mlruns

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RunSettings:
        """The typed settings of a composed, folded and checked config (bench.validate.validate)."""
        gen, model, task, method = cfg.gen, cfg.model, cfg.task, cfg.method
        return cls(
            Generation(int(gen.max_new_tokens), int(gen.get("batch_size", 1)), float(gen.get("temperature", 0.0)),
                       int(gen.get("top_k", 0)), float(gen.get("top_p", 1.0)), tuple(gen.get("stop_strings", ()))),
            ModelSettings(model.name, model.dtype, model.get("attn_implementation", "sdpa"),
                          model.get("prompt_format", "auto"), float(model.get("tie_margin", 0.0)),
                          model.get("tie_check_dtype")),
            TaskSettings(task.name, task.get("limit")),
            MethodSettings(method.name, sizing_of(method), drafter_settings(method)),
            **{key: cfg[key] for key in ("backend", "device", "seed", "out_dir", "baseline", "warmup_tokens",
                                         "repeats", "starvation_threshold", "tracking", "tracking_uri")
               if key in cfg},
            **({"bootstrap": Bootstrap(**cfg.bootstrap)} if "bootstrap" in cfg else {}),
            compiled=compile_choice(cfg)[0])
