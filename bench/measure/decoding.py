"""Decoding the questions of a run: a question's turns in order (each asked with the earlier turns and the model's
answers), timed, repeated and checked; one question at a time (`QuestionDecoder`, the batch-1 engine) or B at a time
(`BatchQuestionDecoder`, bench/engine/batched.py)."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import contextmanager

import torch

from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.timing import Timing, timed
from bench.measure.contention import available_cores
from tasks.prompts import build_prompt


class PromptTooLong(Exception):
    """A turn's prompt plus gen.max_new_tokens does not fit in the model's context window."""


def check_fits(prompt: list[int], max_new_tokens: int, context: int | None, turn: int = 0) -> None:
    """Raise PromptTooLong when prompt + max_new_tokens exceeds the context window (None: unknown, no limit)."""
    if context is not None and len(prompt) + max_new_tokens > context:
        raise PromptTooLong(f"turn {turn + 1}: prompt of {len(prompt)} tokens + gen.max_new_tokens={max_new_tokens} "
                            f"> the model's context window of {context} tokens")


class RepeatMismatchError(RuntimeError):
    """Repeats of one turn gave different tokens: its times are not of one decode, so no median is taken."""


def rewinder(drafter) -> Callable[[], None]:
    """What to call before each repeat of a turn after the first: it puts back what a drafter that learns across
    prompts knew before the first repeat, so that every repeat drafts alike and the turn's lesson is learned once
    (a no-op for other drafters)."""
    if drafter is None or not drafter.learns_across_prompts:
        return lambda: None
    state = drafter.learned_state()
    return lambda: drafter.restore_learned_state(state)


class QuestionDecoder:
    """Decodes a (multi-turn) question with one engine; turn k is asked with turns < k and the model's answers.
    Each turn is decoded and timed `repeats` times with the same seed; every repeat must give the same tokens.
    Raises PromptTooLong before a turn that would not fit in `context` tokens. With `energy` (a running total of the
    device's joules, bench.measure.gpu.GpuMonitor.energy_joules) each turn also records `energy_j`, the median over
    repeats of the joules used while it decoded."""

    def __init__(self, engine: SpeculativeEngine, tokenizer, stop: StopCondition, device: torch.device,
                 context: int | None = None, repeats: int = 1, energy: Callable[[], float | None] | None = None):
        self.engine, self.tokenizer, self.stop, self.device, self.context = engine, tokenizer, stop, device, context
        self.repeats, self.energy = repeats, energy
        self.cores = available_cores()

    def __call__(self, question: dict, seed: int) -> list[dict]:
        conversation, turns = [], []
        for index, user_turn in enumerate(question["turns"]):
            conversation.append({"role": "user", "content": user_turn})
            prompt = build_prompt(self.tokenizer, conversation)
            check_fits(prompt, self.stop.max_new_tokens, self.context, index)
            out, timings = self._repeated(prompt, seed + index, f"question {question['question_id']} turn {index}")
            text = self.tokenizer.decode(out.tokens, skip_special_tokens=True).strip()
            conversation.append({"role": "assistant", "content": text})
            turns.append({"text": text, "token_ids": out.tokens, "decode_steps": out.decode_steps,
                          "accept_lengths": out.accept_lengths, "prompt_ids": prompt, **self._times(timings),
                          "phase_times": {k: round(v, 6) for k, v in out.phase_seconds.items()},
                          "verified_tokens": out.verified_tokens, "drafted_tokens": out.drafted_tokens,
                          "tree_steps": out.tree_steps,
                          "prompt_tokens": len(prompt)})
        return turns

    def _repeated(self, prompt: list[int], seed: int, where: str):
        """The turn's output (checked equal across repeats) and each repeat's (Timing, [joules])."""
        first, timings = None, []
        rewind = rewinder(self.engine.drafter)
        for repeat in range(self.repeats):
            if repeat:
                rewind()
            with self._metered() as (timing, joules):
                out = self.engine.generate(prompt, self.stop, seed=seed)
            timings.append((timing, joules))
            first = out if first is None else first
            if out.tokens != first.tokens:
                raise RepeatMismatchError(
                    f"{where}: repeat {repeat + 1} of {self.repeats} gave other tokens than repeat 1 under the same "
                    f"settings and seed; decoding is not deterministic here, so its times cannot be medianed "
                    f"(run with repeats=1)")
        return first, timings

    @contextmanager
    def _metered(self):
        """timed(device), and with an energy meter the joules used inside, read after the device synchronised:
        yields (Timing, a one-item list that then holds the joules, or None where unread)."""
        joules = [None]
        before = self.energy() if self.energy else None
        with timed(self.device) as timing:
            yield timing, joules
        after = self.energy() if before is not None else None
        joules[0] = None if after is None else after - before

    def _times(self, metered: list[tuple[Timing, list]], share: float = 1.0) -> dict:
        """wall_time (the median over repeats, Spec-Bench's field) and every repeat's times (records.TIMING_KEYS);
        with an energy meter `energy_j`, the median over repeats of the joules (None where a reading failed).
        Batched, the turn's `share` of its batch's."""
        timings = [timing for timing, _ in metered]
        walls = [t.wall * share for t in timings]
        times = {"wall_time": statistics.median(walls), "wall_times": walls}
        if timings[0].cpu is not None:
            times.update(cpu_times=[t.cpu * share for t in timings], threads=timings[0].threads, cores=self.cores)
        if self.energy is not None:
            joules = [reading[0] for _, reading in metered]
            times["energy_j"] = None if None in joules else round(statistics.median(joules) * share, 6)
        return times


class BatchQuestionDecoder(QuestionDecoder):
    """Decodes questions B at a time with a BatchedEngine: turn k of every question of the group in one batch, each
    asked with its own turns < k and answers. A turn's times are the row's share of the batch's (its tokens over the
    batch's tokens), so a question's tokens/s is its batch's throughput and the shares add up to the batch's time;
    `latency` is the seconds from the batch's start until that row's last token (`row_latencies`), `batch_rows` the
    rows decoded together. Returns per question its turns, or the PromptTooLong that stopped it."""

    def __call__(self, questions: list[dict], seeds: list[int]) -> list[list[dict] | PromptTooLong]:
        results: list = [[] for _ in questions]
        conversations: list[list[dict]] = [[] for _ in questions]
        for index in range(max(len(q["turns"]) for q in questions)):
            rows, prompts = [], []
            for i, question in enumerate(questions):
                if index >= len(question["turns"]) or isinstance(results[i], PromptTooLong):
                    continue
                conversations[i].append({"role": "user", "content": question["turns"][index]})
                prompt = build_prompt(self.tokenizer, conversations[i])
                try:
                    check_fits(prompt, self.stop.max_new_tokens, self.context, index)
                except PromptTooLong as err:
                    results[i] = err
                    continue
                rows.append(i)
                prompts.append(prompt)
            if not rows:
                continue
            ids = ", ".join(str(questions[i]["question_id"]) for i in rows)
            out, timings = self._repeated(prompts, [seeds[i] + index for i in rows], f"questions {ids} turn {index}")
            total = sum(len(turn.tokens) for turn in out.turns)
            latencies = row_latencies(timings[0][0].wall, out.finish_seconds)
            for i, prompt, turn, latency in zip(rows, prompts, out.turns, latencies):
                share = len(turn.tokens) / total
                text = self.tokenizer.decode(turn.tokens, skip_special_tokens=True).strip()
                conversations[i].append({"role": "assistant", "content": text})
                times = self._times(timings, share)
                results[i].append({"text": text, "token_ids": turn.tokens, "decode_steps": turn.decode_steps,
                                   "accept_lengths": turn.accept_lengths, "prompt_ids": prompt, **times,
                                   "phase_times": {k: round(v * share, 6) for k, v in out.phase_seconds.items()},
                                   "verified_tokens": turn.verified_tokens, "drafted_tokens": turn.drafted_tokens,
                                   "prompt_tokens": len(prompt),
                                   "latency": round(latency, 6), "batch_rows": len(rows)})
        return results

    def _repeated(self, prompts: list[list[int]], seeds: list[int], where: str):
        """The batch's output (checked equal across repeats) and each repeat's (Timing, [joules])."""
        first, timings = None, []
        rewind = rewinder(self.engine.drafter)
        for repeat in range(self.repeats):
            if repeat:
                rewind()
            with self._metered() as (timing, joules):
                out = self.engine.generate(prompts, self.stop, seeds)
            timings.append((timing, joules))
            first = out if first is None else first
            if [t.tokens for t in out.turns] != [t.tokens for t in first.turns]:
                raise RepeatMismatchError(f"{where}: repeat {repeat + 1} of {self.repeats} gave other tokens than "
                                          f"repeat 1 under the same settings and seeds (run with repeats=1)")
        return first, timings


def row_latencies(batch_wall: float, finish_seconds: list[float]) -> list[float]:
    """Each row's latency in the batch timed as `batch_wall` seconds (the repeat whose output is kept): the batch's
    wall time less what the engine timed after that row's last token. The row that finished last gets the batch's
    wall time exactly, so latency and wall time come from the same clock reads and load cannot order them otherwise."""
    last = max(finish_seconds)
    return [batch_wall - (last - finish) for finish in finish_seconds]


def decode_group(decoder: QuestionDecoder, questions: list[dict], seeds: list[int]) -> list[list[dict] | PromptTooLong]:
    """Each question's turns (or the PromptTooLong that stopped it): together under a BatchQuestionDecoder, else one
    question after another."""
    if isinstance(decoder, BatchQuestionDecoder):
        return decoder(questions, seeds)
    results = []
    for question, seed in zip(questions, seeds):
        try:
            results.append(decoder(question, seed))
        except PromptTooLong as err:
            results.append(err)
    return results
