"""`SpsTrainSettings`: the `train.*` of SpS's draft training (methods/sps/train.py), checked and handed down by the
training command (bench/train.py, through methods/heads/settings.py `TrainingRun`)."""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from bench.artifacts import RELEASED_MODEL
from bench.errors import ConfigError
from methods.heads.settings import StintSettings, whole_numbers
from methods.sps.draft import resolve_draft_path


@dataclass(frozen=True)
class SpsTrainSettings(StintSettings):
    """A stint's settings (out_dir: the method's `drafter.draft_path`) and the draft's: which target layers it is
    made of, its ShareGPT sequences, and the acceptance check before and after."""

    layers: tuple[int, ...]  # target layers copied into the draft
    seq_len: int  # tokens per ShareGPT training sequence
    max_blocks_per_conversation: int
    eval_questions: int  # Spec-Bench first turns of the acceptance check
    eval_tokens: int  # new tokens per question
    eval_draft_tokens: int  # γ, fixed

    @classmethod
    def from_config(cls, cfg: DictConfig) -> SpsTrainSettings:
        tcfg, draft_path = cfg.train, cfg.method.drafter.draft_path
        if str(draft_path).startswith(RELEASED_MODEL):
            raise ConfigError(f"method.drafter.draft_path={draft_path}: a released model, not trained here; set "
                              f"method.drafter.draft_path=artifacts/sps/{cfg.model.name} to train a draft of its own")
        out_dir = resolve_draft_path(draft_path)
        if out_dir is None:
            raise ConfigError(f"method.drafter.draft_path={draft_path}: training writes a local folder, not a hub id")
        return cls(**cls.fields_of(cfg, out_dir), layers=tuple(tcfg.layers), seq_len=tcfg.seq_len,
                   max_blocks_per_conversation=tcfg.max_blocks_per_conversation, eval_questions=tcfg.eval_questions,
                   eval_tokens=tcfg.eval_tokens, eval_draft_tokens=tcfg.eval_draft_tokens)

    def problems(self) -> list[str]:
        layers = [] if self.layers and all(isinstance(x, int) and not isinstance(x, bool) for x in self.layers) \
            else [f"train.layers={list(self.layers)}: must be a list of target layer indices"]
        return [*super().problems(), *layers, *whole_numbers(1, {f"train.{key}": getattr(self, key) for key in (
            "seq_len", "max_blocks_per_conversation", "eval_questions", "eval_tokens", "eval_draft_tokens")})]
