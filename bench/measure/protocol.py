"""The measurement protocol, written once for every backend: each question answered by the method and, interleaved,
by its baseline (the same questions, in the same groups, each side going first every other group), written to
out_dir as answers.jsonl, baseline.jsonl, skipped.jsonl (prompts too long for the model), summary.csv and meta.json,
and resumed from them. A `Backend` (bench/measure/backends/: our engine, a serving engine) answers the groups."""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from bench.measure.acceptance import write_acceptance
from bench.measure.decoding import PromptTooLong
from bench.measure.metrics import speedup_text, summarize
from bench.records import AnswerFile, answer_record, config_key
from bench.settings import RunSettings
from bench.tracking import track_run

METHOD, BASELINE = "method", "baseline"  # the two sides a backend answers for
BASELINE_METHOD = "vanilla"  # the method name of the baseline's records (baseline.jsonl)


@dataclass(frozen=True)
class KeyInputs:
    """What decides a run's outputs, as run_keys hashes it: what both sides share (model, generation settings,
    seed, question source...) and what is each side's own (the method's config and artifact; a server's url)."""

    shared: dict
    baseline: dict = field(default_factory=dict)
    method: dict = field(default_factory=dict)


def run_keys(inputs: KeyInputs) -> tuple[str, str]:
    """(the baseline's key, the method's key): hashes of what decides each side's outputs."""
    return config_key(**inputs.shared, **inputs.baseline), config_key(**inputs.shared, **inputs.method)


class Backend(ABC):
    """What answers a run's questions for the protocol, on the method's side and on the baseline's: subclasses set
    the attributes and implement the abstract methods; the others are hooks that do nothing unless overridden."""

    label: str  # the method's name in records and reports
    method_is_baseline: bool  # vanilla, or a server without speculation: its answers are its own baseline
    group_size: int  # questions answered together
    group_column: str  # summary.csv's name for group_size (batch_size, concurrency)
    key_inputs: KeyInputs
    start_warnings: tuple[str, ...] = ()  # said on stderr at the start, kept in meta.json
    profile = None  # the forward-time profile predicting the speedup in the summary (None: no prediction)
    engine = "specbench"  # what decodes: our engine, or a server's engine (the per-request records' `engine`)

    def open(self, resources: ExitStack) -> None:
        """Start and check what answering needs (servers, closed with `resources`), before the warm-up."""

    @abstractmethod
    def warm_up(self, side: str, todo: list[dict]) -> None:
        """Untimed answering on `side`, so first-call costs miss the first timed question."""

    def timing_starts(self) -> None:
        """Called after the warm-up, before the first timed group."""

    @abstractmethod
    def answer(self, side: str, group: list[dict], seeds: list[int]) -> list[list[dict] | PromptTooLong]:
        """Each question's turns (records.answer_record's fields) answered on `side`, or the PromptTooLong that
        stopped it."""

    @abstractmethod
    def divergence(self, turns: list[dict], baseline: dict) -> dict | None:
        """Where the method's greedy tokens first leave the baseline record's, and whether it is a numeric tie."""

    def choice_fields(self, turns: list[dict]) -> dict:
        """The backend's own fields of a record's choice, beyond records.answer_record's."""
        return {}

    def timing_ends(self) -> None:
        """Called once the timed groups are done (or interrupted), before the summary."""

    def summary_columns(self, summary: pd.DataFrame, records: list[dict], baselines: dict[int, dict]
                        ) -> pd.DataFrame:
        """metrics.summarize's rows with the backend's own columns."""
        return summary

    @abstractmethod
    def provenance(self, started: float) -> dict:
        """meta.json's facts of where the numbers come from (bench.measure.provenance.run_metadata's keys)."""

    def summary_facts(self, summary: pd.DataFrame | None) -> dict:
        """meta.json's keys read from the summary (None: no answers): profile and its origin, cpu_share, starved."""
        return {"profile": None, "profile_origin": None, "cpu_share": None, "starved": None}

    @abstractmethod
    def heading(self) -> str:
        """The closing table's heading: the method and what it ran on."""

    @abstractmethod
    def closing_columns(self, summary: pd.DataFrame) -> list[str]:
        """The summary's columns the closing table shows."""

    def closing_notes(self, summary: pd.DataFrame) -> list[str]:
        """Lines printed after the closing table."""
        return []


class InterleavedRun:
    """One run of `backend`'s method on the settings' task against its baseline; resumes from the answer files in
    out_dir."""

    def __init__(self, settings: RunSettings, backend: Backend, started: float):
        self.settings, self.backend, self.started = settings, backend, started
        self.baseline_key, method_key = run_keys(backend.key_inputs)
        out_dir = Path(settings.out_dir)
        self.answers = AnswerFile(out_dir / "answers.jsonl", method_key, strict=True)
        self.baselines = self.answers if backend.method_is_baseline else AnswerFile(
            out_dir / "baseline.jsonl", self.baseline_key, strict=False)
        self.skipped = AnswerFile(out_dir / "skipped.jsonl", method_key, strict=False)  # prompts too long
        self.with_baseline = settings.baseline and not backend.method_is_baseline

    def run(self, questions: list[dict]) -> pd.DataFrame | None:
        """Answer every question not answered yet; writes the summary and meta.json (also after an interruption)
        and prints the closing table. Returns the summary (None: no answers)."""
        todo = [q for q in questions if q["question_id"] not in self.answers and q["question_id"] not in self.skipped]
        with ExitStack() as resources:
            self.backend.open(resources)
            if self.settings.warmup_tokens:
                for side in self.sides():
                    self.backend.warm_up(side, todo)
            self.backend.timing_starts()
            try:
                self.answer_all(todo)
            finally:  # also after an interruption: summarise what is done
                self.backend.timing_ends()
                summary = self.finish()
        self.print_closing(summary)
        track_run(self.settings, summary, Path(self.settings.out_dir))  # tracking=mlflow (bench/tracking.py)
        return summary

    def sides(self) -> tuple[str, ...]:
        """The sides this run answers on: the method, and its baseline unless it is its own or baseline=false."""
        return (METHOD, BASELINE) if self.with_baseline else (METHOD,)

    def answer_all(self, todo: list[dict]) -> None:
        """`group_size` questions at a time, the baseline answering the same group where it has not yet; the
        baseline goes first every other group, so neither side always runs second."""
        size = self.backend.group_size
        bar = tqdm(total=len(todo), desc=f"{self.backend.label} on {self.settings.task.name}", unit="q",
                   dynamic_ncols=True)
        for number, start in enumerate(range(0, len(todo), size)):
            group = todo[start : start + size]
            seeds = [self.settings.seed + q["question_id"] for q in group]
            need_baseline = self.with_baseline and any(q["question_id"] not in self.baselines for q in group)
            order = (BASELINE, METHOD) if number % 2 == 0 else (METHOD, BASELINE)
            answered = {side: self.backend.answer(side, group, seeds) for side in order
                        if side == METHOD or need_baseline}
            for index, question in enumerate(group):
                baseline_turns = answered[BASELINE][index] if need_baseline else None
                self.store(question, answered[METHOD][index], baseline_turns)
            bar.update(len(group))
            if self.answers.records:
                bar.set_postfix_str(self.progress_note())

    def store(self, question: dict, turns: list[dict] | PromptTooLong,
              baseline_turns: list[dict] | PromptTooLong | None) -> None:
        """Append a question's record (and its baseline's), or note it skipped when a prompt did not fit."""
        if isinstance(turns, PromptTooLong) or isinstance(baseline_turns, PromptTooLong):
            err = turns if isinstance(turns, PromptTooLong) else baseline_turns
            self.skipped.append({"question_id": question["question_id"], "category": question["category"],
                                 "run_key": self.skipped.run_key, "skipped": str(err)})
            tqdm.write(f"skipped question {question['question_id']}: {err}")
            return
        if baseline_turns is not None and question["question_id"] not in self.baselines:
            self.baselines.append(self.record(question, BASELINE_METHOD, self.baseline_key, baseline_turns))
        record = self.record(question, self.backend.label, self.answers.run_key, turns)
        record.update(self.exactness(question["question_id"], turns))
        self.answers.append(record)

    def record(self, question: dict, method: str, run_key: str, turns: list[dict]) -> dict:
        """records.answer_record's line with the backend's own choice fields."""
        record = answer_record(question, self.settings.model.name, method, run_key, turns)
        record["choices"][0].update(self.backend.choice_fields(turns))
        return record

    def exactness(self, question_id: int, turns: list[dict]) -> dict:
        """exact_match and divergence against the baseline's record: null when sampling, or without one yet."""
        if not self.settings.generation.greedy:
            return {"exact_match": None, "divergence": None}
        if self.backend.method_is_baseline:
            return {"exact_match": True, "divergence": None}
        if question_id not in self.baselines:
            return {}
        baseline = self.baselines.records[question_id]
        exact = [t["token_ids"] for t in turns] == baseline["choices"][0]["token_ids"]
        return {"exact_match": exact, "divergence": None if exact else self.backend.divergence(turns, baseline)}

    def summary(self, ci_samples: int) -> pd.DataFrame:
        """metrics.summarize of the answers so far against their baselines (ci_samples=0: no interval)."""
        return summarize(self.backend.label, list(self.answers.records.values()), self.baselines.records,
                         starvation_threshold=self.settings.starvation_threshold, ci_samples=ci_samples,
                         ci_seed=self.settings.bootstrap.seed, profile=self.backend.profile)

    def progress_note(self) -> str:
        """The progress bar's note: the speedup and #MAT so far."""
        row = self.summary(ci_samples=0).iloc[-1]
        return f"speedup {row.speedup:.2f}x  accepted/step {row.mean_accepted_tokens:.2f}"

    def finish(self) -> pd.DataFrame | None:
        """summary.csv and meta.json of what is answered so far; returns the summary (None: no answers)."""
        out_dir = Path(self.settings.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        summary = None
        if self.answers.records:
            summary = self.summary(ci_samples=self.settings.bootstrap.samples)
            summary.insert(2, self.backend.group_column, self.backend.group_size)
            summary = self.backend.summary_columns(summary, list(self.answers.records.values()),
                                                   self.baselines.records)
            summary.to_csv(out_dir / "summary.csv", index=False)
            write_acceptance(out_dir, list(self.answers.records.values()), self.backend.label, self.backend.engine)
        meta = {**self.backend.provenance(self.started), "run_key": self.answers.run_key,
                "baseline_run_key": self.baseline_key, "skipped_questions": sorted(self.skipped.records),
                "start_warnings": self.backend.start_warnings, **self.backend.summary_facts(summary)}
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return summary

    def print_closing(self, summary: pd.DataFrame | None) -> None:
        """The heading, the skipped questions, the closing table and the backend's notes."""
        print(f"\n{self.backend.heading()} -> {self.settings.out_dir}")
        if self.skipped.records:
            print(f"skipped {len(self.skipped.records)} question(s) whose prompt + gen.max_new_tokens exceed the "
                  f"model's context window: {self.skipped.path}")
        if summary is None:
            return
        table = closing_table(summary, self.backend.closing_columns(summary))
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        for line in self.backend.closing_notes(summary):
            print(line)


def closing_table(summary: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The table printed at the end of a run: `columns` of the summary, the speedup as `1.35x (1.21-1.49)`."""
    shown = summary[columns].copy()
    shown["speedup"] = [speedup_text(*values) for values in
                        zip(summary.speedup, summary.speedup_ci_low, summary.speedup_ci_high)]
    return shown.rename(columns={"speedup": "speedup (95% CI)"})

