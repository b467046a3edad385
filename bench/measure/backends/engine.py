"""Our engine as a backend of the protocol (bench/measure/protocol.py): the method's question decoder and its
baseline's (vanilla decoding), batch 1 or `gen.batch_size` rows at a time, divergences judged for numeric ties, the
GPU's facts and the predicted speedup of the target's forward-time profile."""
from __future__ import annotations

import sys
import time

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from bench import method_identity
from bench.engine.compiled import BUCKETS
from bench.engine.kvcache import attention_windows
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import DecoderParts, build_drafter, decoders
from bench.measure.contention import verdict
from bench.measure.decoding import PromptTooLong, decode_group
from bench.measure.exactness import find_divergence
from bench.measure.gpu import GpuMonitor
from bench.measure.protocol import BASELINE, METHOD, Backend, KeyInputs
from bench.measure.provenance import run_metadata, starvation_facts
from bench.models import context_window, eos_token_ids, load_check_model
from bench.planning.profile import profile_for_run, profile_note, profile_origin, setting_command
from bench.settings import RunSettings, compile_choice
from tasks.prompts import build_prompt

TEMPLATE_TOKENS_PER_TURN = 32  # a chat template's tokens around a turn, at most (a compiled run sizes its cache by it)
SPEC_BENCH_WARM_UPS = 3  # Spec-Bench's eval.py decodes its first question this many times before timing
SUMMARY_COLUMNS = ["task", "n_questions", "tokens_per_s", "baseline_tokens_per_s", "speedup", "predicted_speedup",
                   "mean_accepted_tokens", "mean_verified_tokens", "draft_share", "verify_share", "exact_match",
                   "cpu_share"]  # printed at the end of a run; speedup with its interval


def engine_key_inputs(cfg: DictConfig, device: torch.device, drafter, compiled: bool | None = None) -> KeyInputs:
    """What decides an engine run's outputs: model, device, generation settings, seed, question source, whether the
    forwards are compiled (None: as engine.compile decides for `cfg`); for the method also its config and its
    drafter's artifact (drafts' weights or datastore)."""
    if compiled is None:
        compiled = compile_choice(cfg)[0]
    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    if gen.get("batch_size") == 1:
        del gen["batch_size"]  # batch-1 runs keep the keys they had before batching existed
    shared = {"model": OmegaConf.to_container(cfg.model, resolve=True), "device": str(device), "gen": gen,
              "seed": cfg.seed, "source": OmegaConf.to_container(cfg.task.source, resolve=True)}
    if compiled:  # compiled kernels round otherwise than eager's
        shared["engine"] = {**OmegaConf.to_container(cfg.engine, resolve=True), "compile": "on"}
    method = method_identity(OmegaConf.to_container(cfg.method))  # runs keep the keys they had before
    return KeyInputs(shared, method={"method": method, "artifact": None if drafter is None else drafter.artifact})


class EngineBackend(Backend):
    """The method's question decoder and its baseline's over one loaded model, the run's profile and GPU monitor.
    Reads the run's typed `settings`; `cfg`, the composed config they were made from, only where it is hashed
    (run keys), dumped (meta.json) or loads something (the profile, the tie judge)."""

    def __init__(self, settings: RunSettings, cfg: DictConfig, model, tokenizer, device: torch.device,
                 questions: int, start_warnings: list[str]):
        self.settings, self.cfg, self.model, self.tokenizer, self.device = settings, cfg, model, tokenizer, device
        self.start_warnings = start_warnings
        gen, method = settings.generation, settings.method
        self.stop = StopCondition(gen.max_new_tokens, frozenset(eos_token_ids(model, tokenizer)), gen.stop_strings,
                                  tokenizer)
        self.batch = gen.batch_size
        self.group_size, self.group_column = self.batch, "batch_size"
        self.rows_per_batch = clamped_batch(self.batch, questions, settings.task.name)
        planned = method.sizing == "auto"
        self.label, self.method_is_baseline = method.label, method.drafter is None
        self.context = context_window(model)
        windows = attention_windows(model)  # first: refuses a model whose cache cannot be cut back, before any drafter
        # setup; the profile is of the forwards the run times (a windowed model's run eager, compiled or not)
        self.profile_compiled = settings.compiled and all(window is None for window in windows.values())
        self.run_profile = profile_for_run(cfg, model, device, make=planned, compiled=self.profile_compiled)
        self.profile = self.run_profile if self.batch == 1 else None  # the predicted speedup is batch 1's
        self.profile_uses = " and ".join(use for use, used in (("predicted_speedup", self.batch == 1),
                                                               ("method.sizing=auto", planned)) if used)
        self.gpu = GpuMonitor(device)
        energy = self.gpu.energy_joules if self.gpu.energy_source else None  # joules per turn, where NVML can tell
        self.parts = DecoderParts(tokenizer, self.stop, device, self.context, settings.repeats, energy)
        self.compiled = settings.compiled
        self.decoders = self.build_decoders()
        self.compile_seconds = None  # compiled: seconds compiling before anything is timed (compile_for)
        self._tie_judge = None  # loaded at the first divergence: model.tie_check_dtype's copy of the target

    def build_decoders(self) -> dict:
        """The method's and the baseline's question decoders, compiled or eager as `self.compiled` says."""
        gen, method = self.settings.generation, self.settings.method
        sampling = SamplingConfig(gen.temperature, gen.top_k, gen.top_p)
        baseline_engine = SpeculativeEngine(self.model, None, sampling, compile=self.compiled)
        drafter = build_drafter(method.drafter, self.model, self.tokenizer, sampling)
        profile = self.run_profile if method.sizing == "auto" else None
        return dict(zip((METHOD, BASELINE), decoders(self.model, drafter, sampling, profile, self.batch,
                                                     baseline_engine, self.parts, self.compiled)))

    @property
    def key_inputs(self) -> KeyInputs:
        return engine_key_inputs(self.cfg, self.device, self.decoders[METHOD].engine.drafter, self.compiled)

    def tie_judge(self):
        """The model that decides numeric ties: a copy of the target in model.tie_check_dtype, else the target."""
        if self._tie_judge is None:
            copy = load_check_model(self.cfg.model, self.device, self.settings.model.tie_check_dtype)
            self._tie_judge = self.model if copy is None else copy
        return self._tie_judge

    def warm_up(self, side: str, todo: list[dict]) -> None:
        """Untimed decoding of the first question that fits (warmup_tokens new tokens, never more rows than the
        first real batch); a method whose drafter learns across prompts is warmed up as Spec-Bench's eval.py warms
        every method up, which fills what it learns: the first question, all turns, SPEC_BENCH_WARM_UPS times. A
        drafter that does not keep the warm-up's lesson (`learns_in_warm_up` false) is put back as it was."""
        drafter = self.decoders[side].engine.drafter
        before = None if drafter is None or drafter.learns_in_warm_up else drafter.learned_state()
        self.decode_warm_up(side, todo)
        if before is not None:
            drafter.restore_learned_state(before)

    def compile_for(self, questions: list[dict]) -> None:
        """Compiled: each side's cache sized for the task's longest turn and every graph its steps run made, before
        anything is timed (the seconds go to meta.json's compile_seconds and are said in one line). Where the compiler
        fails, both sides go on eager, said in one line."""
        if not self.compiled or not questions:
            return
        sides = (METHOD, BASELINE) if self.settings.baseline and not self.method_is_baseline else (METHOD,)
        drafter = self.decoders[METHOD].engine.drafter  # None: the batched engine's vanilla
        most = 0 if drafter is None else drafter.most_nodes()
        if most is not None and 1 + most > BUCKETS[-1]:
            self.run_eager(f"{self.label}'s trees reach {1 + most} inputs, more than the largest compiled graph's "
                           f"{BUCKETS[-1]}")
            return
        started = time.perf_counter()
        try:
            for side in sides:
                self.precompile(side, questions)
        except Exception as error:  # noqa: BLE001 (any compiler failure: the run goes on eager, said)
            reason = (str(error).strip().splitlines() or [""])[0][:200]
            self.run_eager(f"compiling failed ({type(error).__name__}: {reason})")
            return
        self.compile_seconds = time.perf_counter() - started

    def run_eager(self, why: str) -> None:
        """Both sides eager after all (under eager's run key), said in one line."""
        print(f"warning: engine.compile: {why}; both sides run eager (engine.compile=off skips compiling)",
              file=sys.stderr)
        self.compiled = False
        if self.profile_compiled:  # eager steps are predicted and sized from eager times
            self.profile_compiled = False
            self.run_profile = profile_for_run(self.cfg, self.model, self.device, self.settings.method.sizing == "auto",
                                               compiled=False)
            self.profile = self.run_profile if self.batch == 1 else None
        self.decoders = self.build_decoders()

    def precompile(self, side: str, questions: list[dict]) -> None:
        """compile_for's work on one side."""
        started = time.perf_counter()
        engine = self.decoders[side].engine
        per_turn = TEMPLATE_TOKENS_PER_TURN + self.stop.max_new_tokens
        longest = max(len(build_prompt(self.tokenizer, [{"role": "user", "content": "\n".join(q["turns"])}]))
                      + max(len(q["turns"]), 1) * per_turn for q in questions)
        most = 0 if engine.drafter is None else engine.drafter.most_nodes()  # vanilla: 0, one token a step
        largest = BUCKETS[-1] if most is None else 1 + most  # at most BUCKETS[-1] here (compile_for)
        if self.batch > 1:  # the batched engine: the target's graphs for [rows, bucket]; its drafters run eager
            batch = engine.compiled
            if batch is None:  # a model the compiled engine does not handle (said when the engine was made)
                return
            batch.reserve(self.rows_per_batch, longest)
            batch.precompile(largest)
            capacity = f"{batch.rows} rows of {batch.capacity} positions"
        else:
            target = engine.target
            if not target.compiled:  # a model the compiled engine does not handle (said when its target was made)
                return
            target.reserve(longest)
            target.precompile(build_prompt(self.tokenizer, [{"role": "user", "content": "Hello"}]), largest)
            engine.drafter.reserve(target.capacity - BUCKETS[-1])
            engine.drafter.precompile()
            capacity = f"{target.capacity} positions"
        print(f"engine.compile: the {side}'s graphs made in {time.perf_counter() - started:.1f} s for a cache of "
              f"{capacity}, before timing", file=sys.stderr)

    def decode_warm_up(self, side: str, todo: list[dict]) -> None:
        """warm_up's decoding."""
        if side == METHOD and self.learns_across_prompts:
            for _ in range(SPEC_BENCH_WARM_UPS):
                decode_group(self.decoders[side], todo[:1], [self.settings.seed + q["question_id"] for q in todo[:1]])
            return
        tokens, seed, context = self.settings.warmup_tokens, self.settings.seed, self.context
        warm_prompts = (build_prompt(self.tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in todo)
        warm_prompt = next((p for p in warm_prompts if context is None or len(p) + tokens <= context), None)
        if warm_prompt is None:
            return
        warm_stop = StopCondition(tokens, self.stop.eos_token_ids)
        engine = self.decoders[side].engine
        if self.batch == 1:
            engine.generate(warm_prompt, warm_stop, seed=seed)
        else:
            warm_rows = min(self.rows_per_batch, len(todo))
            engine.generate([warm_prompt] * warm_rows, warm_stop, [seed] * warm_rows)

    @property
    def learns_across_prompts(self) -> bool:
        """Whether the method's drafter learns across prompts (its rows then depend on the question order)."""
        drafter = self.decoders[METHOD].engine.drafter  # None: the batched engine's vanilla
        return drafter is not None and drafter.learns_across_prompts

    def answer(self, side: str, group: list[dict], seeds: list[int]) -> list[list[dict] | PromptTooLong]:
        results = decode_group(self.decoders[side], group, seeds)
        self.gpu.sample()
        return results

    def divergence(self, turns: list[dict], baseline: dict) -> dict | None:
        return find_divergence(self.model, turns, baseline, self.settings.model.tie_margin, self.tie_judge())

    def provenance(self, started: float) -> dict:
        """run_metadata, and whether the drafter learned across prompts (warmed up as Spec-Bench; its rows depend on
        the question order, and a resumed run's drafter knows only the questions it decoded itself)."""
        meta = run_metadata(self.cfg, self.settings.model.dtype, self.device, started, self.gpu)
        learns = self.learns_across_prompts
        meta["drafter_learns_across_prompts"] = learns
        meta["compiled"] = self.compiled
        meta["compile_seconds"] = None if self.compile_seconds is None else round(self.compile_seconds, 2)
        meta["warm_up"] = (f"the first question, all turns, {SPEC_BENCH_WARM_UPS} times (Spec-Bench's)" if learns
                           else f"{self.settings.warmup_tokens} tokens") if self.settings.warmup_tokens else None
        if learns and meta["warm_up"] and not self.decoders[METHOD].engine.drafter.learns_in_warm_up:
            meta["warm_up"] += ", what it learned there forgotten"
        return meta

    def summary_facts(self, summary: pd.DataFrame | None) -> dict:
        profile = None if self.run_profile is None else self.run_profile.__dict__
        return {"profile": profile, "profile_origin": self.profile_origin,
                **starvation_facts(summary, self.settings.starvation_threshold)}

    @property
    def profile_origin(self) -> dict | None:
        return None if self.run_profile is None else profile_origin(self.cfg, self.run_profile)

    def heading(self) -> str:
        model = self.settings.model
        return f"{self.label} on {self.settings.task.name} ({model.name}, {model.dtype}, {self.device})"

    def closing_columns(self, summary: pd.DataFrame) -> list[str]:
        """SUMMARY_COLUMNS, and the joules per token where energy was measured."""
        energy = ["joules_per_token", "baseline_joules_per_token"] if summary.joules_per_token.notna().any() else []
        return SUMMARY_COLUMNS + energy

    def closing_notes(self, summary: pd.DataFrame) -> list[str]:
        """The CPU share's verdict, and where the profile behind the predicted speedup (or the sizing) was measured."""
        notes = [verdict(summary.cpu_share.iloc[-1], self.settings.starvation_threshold)]
        if self.profile_uses:
            notes.append(profile_note(self.profile_origin, self.profile_uses,
                                      setting_command(self.cfg, self.device, self.profile_compiled)))
        return notes


def clamped_batch(batch: int, questions: int, task: str) -> int:
    """Rows per batch: gen.batch_size, or the task's question count when that is smaller (said once on stderr)."""
    if batch <= questions:
        return batch
    print(f"note: gen.batch_size={batch} > the {questions} question(s) of task '{task}': decoding them "
          f"{questions} at a time", file=sys.stderr)
    return questions
