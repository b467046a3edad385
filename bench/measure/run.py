"""One benchmark run: decode every question of a task with a method and, interleaved, with vanilla."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bench import method_label, sizing_of
from bench.config import fold_deprecated
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.errors import ConfigError
from bench.engine.sampling import SamplingConfig
from bench.measure.assemble import DecoderParts, build_drafter, decoders
from bench.measure.contention import available_cores, machine_load, start_warnings, verdict
from bench.measure.decoding import PromptTooLong, decode_group
from bench.measure.exactness import find_divergence
from bench.measure.gpu import GpuMonitor
from bench.measure.metrics import speedup_text, summarize
from bench.measure.serving.run import run_server
from bench.measure.provenance import run_keys, run_metadata, starvation_facts
from bench.models import context_window, eos_token_ids, load_check_model, load_model, resolve_device
from bench.planning.profile import profile_for_run
from bench.records import AnswerFile, answer_record
from bench.validate import validate
from tasks import load_questions
from tasks.prompts import build_prompt

SUMMARY_COLUMNS = ["task", "n_questions", "tokens_per_s", "baseline_tokens_per_s", "speedup", "predicted_speedup",
                   "mean_accepted_tokens", "mean_verified_tokens", "draft_share", "verify_share", "exact_match",
                   "cpu_share"]  # printed at the end of a run; speedup with its interval


def run(cfg: DictConfig) -> pd.DataFrame:
    """Run `cfg.method` on `cfg.task`; writes answers.jsonl, baseline.jsonl, summary.csv, meta.json to out_dir, and
    skipped.jsonl for questions too long for the model's context window. Returns the summary (None: no answers)."""
    backend = cfg.get("backend", "engine")
    if backend == "server":  # a serving engine over HTTP (docs/serving.md)
        return run_server(cfg)
    if backend != "engine" or cfg.get("server") is not None:
        raise ConfigError(f"backend={backend} with server={(cfg.get('server') or {}).get('name')}: use backend=engine "
                          f"(our engine, no server=...) or backend=server with server=<conf/server/ name>")
    started = time.time()
    validate(fold_deprecated(cfg))
    device = resolve_device(cfg.device)
    warned = start_warnings(torch.get_num_threads(), available_cores(), machine_load(), device.type == "cuda")
    for warning in warned:
        print(f"WARNING: {warning}", file=sys.stderr)
    questions = load_questions(cfg.task)  # before the model: a bad task file is refused at once
    model, tokenizer = load_model(cfg.model, device)
    bench = BenchmarkRun(cfg, model, tokenizer, device, len(questions))
    todo = [q for q in questions if q["question_id"] not in bench.answers and q["question_id"] not in bench.skipped]
    bench.warm_up(todo)
    try:
        bench.decode(todo)
    finally:  # also after an interruption: summarise what is done
        summary = bench.finish(started, warned)
    bench.print_closing(summary)
    return summary


class BenchmarkRun:
    """One run's parts (decoders of the method and of its vanilla baseline, run keys, answer files) and its steps."""

    def __init__(self, cfg: DictConfig, model, tokenizer, device: torch.device, questions: int):
        self.cfg, self.model, self.tokenizer, self.device = cfg, model, tokenizer, device
        self.sampling = SamplingConfig(cfg.gen.temperature, cfg.gen.top_k, cfg.gen.top_p)
        self.stop = StopCondition(cfg.gen.max_new_tokens, frozenset(eos_token_ids(model, tokenizer)),
                                  tuple(cfg.gen.stop_strings), tokenizer)
        self.batch = int(cfg.gen.get("batch_size", 1))
        self.rows_per_batch = clamped_batch(self.batch, questions, cfg.task.name)
        sizing = sizing_of(cfg.method)
        planned = sizing == "auto"
        self.method = method_label(cfg.method.name, sizing)
        self.is_vanilla = cfg.method.get("drafter") is None
        self.context = context_window(model)
        plain = SpeculativeEngine(model, None, self.sampling)  # first: refuses a model it cannot serve before any drafter setup
        self.profile = profile_for_run(cfg, model, device, make=planned)
        drafter = build_drafter(cfg.method, model, tokenizer, self.sampling)
        self.gpu = GpuMonitor(device)
        energy = self.gpu.energy_joules if self.gpu.energy_source else None  # joules per turn, where NVML can tell
        parts = DecoderParts(tokenizer, self.stop, device, self.context, cfg.repeats, energy)
        self.decoder, self.vanilla = decoders(model, drafter, self.sampling, self.profile if planned else None,
                                              self.batch, plain, parts)
        self.baseline_key, method_key = run_keys(cfg, device, self.decoder.engine.drafter)
        out_dir = Path(cfg.out_dir)
        self.answers = AnswerFile(out_dir / "answers.jsonl", method_key, strict=True)
        self.baselines = self.answers if self.is_vanilla else AnswerFile(out_dir / "baseline.jsonl",
                                                                         self.baseline_key, strict=False)
        self.skipped = AnswerFile(out_dir / "skipped.jsonl", method_key, strict=False)  # prompts too long for the model
        self._tie_judge = None  # loaded at the first divergence: model.tie_check_dtype's copy of the target

    def tie_judge(self):
        """The model that decides numeric ties: a copy of the target in model.tie_check_dtype, else the target."""
        if self._tie_judge is None:
            copy = load_check_model(self.cfg.model, self.device, self.cfg.model.get("tie_check_dtype"))
            self._tie_judge = self.model if copy is None else copy
        return self._tie_judge

    def warm_up(self, todo: list[dict]) -> None:
        """Untimed decoding of the first question that fits, so first-call costs miss the first question."""
        cfg, context = self.cfg, self.context
        warm_prompts = (build_prompt(self.tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in todo)
        warm_prompt = next((p for p in warm_prompts if context is None or len(p) + cfg.warmup_tokens <= context), None)
        if warm_prompt is None or not cfg.warmup_tokens:
            return
        warm_stop = StopCondition(cfg.warmup_tokens, self.stop.eos_token_ids)
        warm_rows = min(self.rows_per_batch, len(todo))  # never more rows than the first real batch
        for decoder in {id(d): d for d in (self.decoder, self.vanilla)}.values():
            if self.batch == 1:
                decoder.engine.generate(warm_prompt, warm_stop, seed=cfg.seed)
            else:
                decoder.engine.generate([warm_prompt] * warm_rows, warm_stop, [cfg.seed] * warm_rows)

    def decode(self, todo: list[dict]) -> None:
        """Every question not answered yet, `batch` at a time, each group with its vanilla baseline interleaved."""
        cfg, baselines = self.cfg, self.baselines
        with_baseline = cfg.baseline and not self.is_vanilla
        bar = tqdm(total=len(todo), desc=f"{self.method} on {cfg.task.name}", unit="q", dynamic_ncols=True)
        for number, start in enumerate(range(0, len(todo), self.batch)):
            group = todo[start : start + self.batch]
            seeds = [cfg.seed + q["question_id"] for q in group]
            base_results = None
            need_base = with_baseline and any(q["question_id"] not in baselines for q in group)
            if need_base and number % 2 == 0:  # alternate the order so neither side always runs second
                base_results = decode_group(self.vanilla, group, seeds)
            results = decode_group(self.decoder, group, seeds)
            if need_base and base_results is None:
                base_results = decode_group(self.vanilla, group, seeds)
            for index, (question, turns) in enumerate(zip(group, results)):
                self.store_answer(question, turns, None if base_results is None else base_results[index])
            bar.update(len(group))
            if self.answers.records:
                bar.set_postfix_str(_progress_note(self.method, self.answers, baselines))

    def store_answer(self, question: dict, turns, base_turns) -> None:
        """Append a question's record (and its vanilla baseline's), or note it skipped when a prompt did not fit."""
        cfg, baselines = self.cfg, self.baselines
        if isinstance(turns, PromptTooLong) or isinstance(base_turns, PromptTooLong):
            err = turns if isinstance(turns, PromptTooLong) else base_turns
            self.skipped.append({"question_id": question["question_id"], "category": question["category"],
                                 "run_key": self.skipped.run_key, "skipped": str(err)})
            tqdm.write(f"skipped question {question['question_id']}: {err}")
            return
        if base_turns is not None and question["question_id"] not in baselines:
            baselines.append(answer_record(question, cfg.model.name, "vanilla", self.baseline_key, base_turns))
        record = answer_record(question, cfg.model.name, self.method, self.answers.run_key, turns)
        if not self.sampling.greedy:
            record["exact_match"], record["divergence"] = None, None
        elif self.is_vanilla:
            record["exact_match"], record["divergence"] = True, None
        elif question["question_id"] in baselines:
            base = baselines.records[question["question_id"]]
            record["exact_match"] = [t["token_ids"] for t in turns] == base["choices"][0]["token_ids"]
            judge = None if record["exact_match"] else self.tie_judge()
            record["divergence"] = find_divergence(self.model, turns, base, cfg.model.tie_margin, judge)
        self.answers.append(record)
        self.gpu.sample()

    def finish(self, started: float, warned: list[str]) -> pd.DataFrame | None:
        """summary.csv and meta.json of what is answered so far; returns the summary (None: no answers)."""
        cfg, answers, out_dir = self.cfg, self.answers, Path(self.cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        summary = summarize(self.method, list(answers.records.values()), self.baselines.records,
                            starvation_threshold=cfg.starvation_threshold, ci_samples=cfg.bootstrap.samples,
                            ci_seed=cfg.bootstrap.seed, profile=self.profile if self.batch == 1 else None
                            ) if answers.records else None
        if summary is not None:
            summary.insert(2, "batch_size", self.batch)
            summary.to_csv(out_dir / "summary.csv", index=False)
        meta = {**run_metadata(cfg, self.device, started, self.gpu), "run_key": answers.run_key,
                "baseline_run_key": self.baseline_key, "skipped_questions": sorted(self.skipped.records),
                "start_warnings": warned, "profile": None if self.profile is None else self.profile.__dict__,
                **starvation_facts(summary, cfg.starvation_threshold)}
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return summary

    def print_closing(self, summary: pd.DataFrame | None) -> None:
        cfg = self.cfg
        print(f"\n{self.method} on {cfg.task.name} ({cfg.model.name}, {cfg.model.dtype}, {self.device}) -> {cfg.out_dir}")
        if self.skipped.records:
            print(f"skipped {len(self.skipped.records)} question(s) whose prompt + gen.max_new_tokens exceed the model's "
                  f"context window: {self.skipped.path}")
        if summary is not None:
            print(closing_table(summary).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
            print(verdict(summary.cpu_share.iloc[-1], cfg.starvation_threshold))


def clamped_batch(batch: int, questions: int, task: str) -> int:
    """Rows per batch: gen.batch_size, or the task's question count when that is smaller (said once on stderr)."""
    if batch <= questions:
        return batch
    print(f"note: gen.batch_size={batch} > the {questions} question(s) of task '{task}': decoding them "
          f"{questions} at a time", file=sys.stderr)
    return questions


def closing_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The table printed at the end of a run: SUMMARY_COLUMNS, the speedup as `1.35x (1.21-1.49)`."""
    energy = ["joules_per_token", "baseline_joules_per_token"] if summary.joules_per_token.notna().any() else []
    shown = summary[SUMMARY_COLUMNS + energy].copy()
    shown["speedup"] = [speedup_text(*values) for values in
                        zip(summary.speedup, summary.speedup_ci_low, summary.speedup_ci_high)]
    return shown.rename(columns={"speedup": "speedup (95% CI)"})


def _progress_note(method: str, answers: AnswerFile, baselines: AnswerFile) -> str:
    row = summarize(method, list(answers.records.values()), baselines.records, ci_samples=0).iloc[-1]
    return f"speedup {row.speedup:.2f}x  accepted/step {row.mean_accepted_tokens:.2f}"

