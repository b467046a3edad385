"""A run's parts from its settings: the method's drafter (its class plus knobs), its engine (batch 1 or
batched, sized by the planner when the run asks for it) and the question decoders of the method and of its
baseline (vanilla decoding)."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import hydra.utils
import torch

from bench.engine.batched import BATCH_PROBE_SHARE, BatchedEngine
from bench.engine.drafter import Drafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.decoding import BatchQuestionDecoder, QuestionDecoder
from bench.planning.costmodel import Profile
from bench.planning.policy import PlannedDrafter, SpeculationPlanner
from bench.settings import DrafterSettings


def build_drafter(drafter: DrafterSettings | None, model, tokenizer, sampling: SamplingConfig) -> Drafter | None:
    """The method's drafter: its class with its knobs, given the run's sampling when it declares that it `samples`
    (bench/engine/drafter.py); None for vanilla."""
    if drafter is None:
        return None
    cls = hydra.utils.get_class(drafter.target)
    knobs = copy.deepcopy(drafter.knobs)  # a drafter may keep (and change) what it is given; the settings stay
    if cls.samples:
        knobs["sampling"] = sampling
    return cls(target=model, tokenizer=tokenizer, **knobs)


@dataclass
class DecoderParts:
    """What every question decoder of a run shares besides its engine."""

    tokenizer: object
    stop: StopCondition
    device: torch.device
    context: int | None  # the model's context window
    repeats: int
    energy: object = None  # joules per turn (bench.measure.gpu.GpuMonitor.energy_joules), where NVML can tell

    def decoder(self, engine, batched: bool) -> QuestionDecoder:
        kind = BatchQuestionDecoder if batched else QuestionDecoder
        return kind(engine, self.tokenizer, self.stop, self.device, self.context, self.repeats, self.energy)


def decoders(model, drafter: Drafter | None, sampling: SamplingConfig, profile: Profile | None, batch: int,
             baseline_engine: SpeculativeEngine, parts: DecoderParts,
             compiled: bool = False) -> tuple[QuestionDecoder, QuestionDecoder]:
    """The method's question decoder and its baseline's (the same one for vanilla itself). With a `profile`, speculation
    is sized by the planner: at batch 1 the drafter is wrapped in PlannedDrafter, above it the batched engine asks
    the planner each step. `baseline_engine` is the baseline's batch-1 engine; `compiled`: the method's engine
    compiles its forwards, as the baseline's must then too."""
    is_baseline = drafter is None  # vanilla: its own baseline
    if batch == 1:
        sized = drafter if profile is None else PlannedDrafter(drafter, profile, parts.device)
        decode = parts.decoder(SpeculativeEngine(model, sized, sampling, compile=compiled), batched=False)
        return decode, decode if is_baseline else parts.decoder(baseline_engine, batched=False)
    planner = None if profile is None or is_baseline else SpeculationPlanner(
        profile, probe_share=BATCH_PROBE_SHARE, partial_drafts=drafter.partial_drafts)
    decode = parts.decoder(BatchedEngine(model, drafter, sampling, planner, compile=compiled), batched=True)
    return decode, decode if is_baseline else parts.decoder(BatchedEngine(model, None, sampling, compile=compiled),
                                                            batched=True)
