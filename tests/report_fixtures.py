"""Hand-built run folders (answers.jsonl, baseline.jsonl, summary.csv, meta.json) with chosen numbers, so the
report and regression tests know every expected value without decoding anything."""
from __future__ import annotations

import json
from pathlib import Path

from bench.measure.metrics import summarize
from bench.records import RECORD_FORMAT

# one question per task: (question_id, category)
QUESTIONS = [(81, "writing"), (161, "translation"), (241, "summarization"), (321, "qa"), (401, "math_reasoning"),
             (481, "rag")]
BASE_TIME = {qid: 1.0 for qid, _ in QUESTIONS}  # vanilla: 12 tokens per turn in 1 s per question
TASK_OF_QID = dict(zip((q for q, _ in QUESTIONS),
                       ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]))
# the long-input task's buckets, one question each (the file order of tasks/data/long_inputs.jsonl's ids)
PROMPT_TOKENS = 20  # of every turn of a record given `drafted`
BUCKET_QUESTIONS = [(1101, "long_1k"), (1201, "long_2k"), (1401, "long_4k"), (1701, "long_7k")]


def record(question_id: int, category: str, method: str, accepts: list[list[int]], wall_time: list[float],
           exact_match: bool | None = True, divergence: dict | None = None, run_key: str = "key",
           cpu_share: float | None = None, drafted: list[int] | None = None) -> dict:
    """A Spec-Bench answer line whose turn k made its prefill's token, then accepts[k] tokens per decode step; with
    `cpu_share`, timed once per turn on one thread, having that share of the CPU; with `drafted`, every turn's steps
    drafted that many nodes each, after a prompt of PROMPT_TOKENS."""
    timing = {} if cpu_share is None else {"wall_times": [[w] for w in wall_time],
                                           "cpu_times": [[w * cpu_share] for w in wall_time],
                                           "threads": [1] * len(wall_time), "cores": [2] * len(wall_time)}
    return {
        "question_id": question_id, "category": category, "answer_id": f"{method}-{question_id}",
        "model_id": "m", "method": method, "run_key": run_key, "tstamp": 1.0, "format": RECORD_FORMAT,
        "choices": [{
            "index": 0,
            "turns": [f"answer {k}" for k in range(len(accepts))],
            "decoding_steps": [len(a) for a in accepts],
            "new_tokens": [1 + sum(a) for a in accepts],
            "wall_time": wall_time,
            "accept_lengths": [x for a in accepts for x in a],
            "token_ids": [list(range(1 + sum(a))) for a in accepts],
            **timing,
            **({} if drafted is None else {"drafted_tokens": [list(drafted)] * len(accepts),
                                           "prompt_tokens": [PROMPT_TOKENS] * len(accepts)}),
        }],
        "exact_match": exact_match,
        "divergence": divergence,
    }


def write_run(path: Path, method: str, answers: list[dict], baselines: list[dict] | None = None, *,
              model: str = "m", dtype: str = "bfloat16", device: str = "cpu", device_name: str = "Test CPU",
              max_new_tokens: int = 32, temperature: float = 0.0, task: str = "all",
              finished: str = "2026-01-01T00:00:00", drafter: dict | None = None,
              torch_version: str = "2.13.0", batch_size: int = 1, sizing: dict | None = None, seed: int = 0,
              weights: dict | None = None, meta_extra: dict | None = None) -> Path:
    """A run folder as bench/measure/run.py writes it; `sizing`: the method config's sizing keys, {"sizing": "auto"}
    or an older run's {"budget": "auto"} or {"batch_policy": "adaptive"}; `weights`: the model config's keys naming
    its weights ({"package": ..., "gguf_file": ...} or {"path": ...}); `meta_extra`: more meta.json keys (a server
    run's backend and server)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in answers))
    if baselines is not None:
        (path / "baseline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in baselines))
    by_qid = {r["question_id"]: r for r in (answers if baselines is None else baselines)}
    summarize(method, answers, by_qid).to_csv(path / "summary.csv", index=False)
    if drafter is None and method != "vanilla":
        drafter = {"_target_": f"methods.{method}.Drafter"}
    meta = {
        "config": {"method": {"name": method, "drafter": drafter,
                              **(sizing or {})},
                   "model": {"name": model, "dtype": dtype, **(weights or {})}, "task": {"name": task, "limit": 1},
                   "gen": {"max_new_tokens": max_new_tokens, "temperature": temperature, "batch_size": batch_size},
                   "seed": seed},
        "git_commit": "abc", "torch": torch_version, "transformers": "5.24.0", "device": device,
        "device_name": device_name, "dtype": dtype, "host": "h", "started": finished, "finished": finished,
        **(meta_extra or {}),
    }
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def turns_of(category: str) -> int:
    """Turns of a question: two for MT-bench's (here the writing one), one for the others."""
    return 2 if category == "writing" else 1


def method_run(path: Path, method: str, factor: dict[int, float], accepts: list[int], diverge: dict | None = None,
               cpu_share: float | None = None, questions: list[tuple[int, str]] = QUESTIONS,
               drafted: list[int] | None = None, **kw) -> Path:
    """A method run whose question qid (of `questions`) ran `factor[qid]` times faster than its interleaved vanilla,
    adding `accepts` tokens per decode step in each turn (after its prefill's token); `diverge` gives qid ->
    divergence record; with `cpu_share`, every turn had that share of the CPU; `drafted`: nodes drafted per step."""
    answers, baselines = [], []
    for qid, category in questions:
        if qid not in factor:
            continue
        turns = turns_of(category)
        divergence = (diverge or {}).get(qid)
        answers.append(record(qid, category, method, [list(accepts)] * turns, [1.0 / turns / factor[qid]] * turns,
                              exact_match=divergence is None, divergence=divergence, cpu_share=cpu_share,
                              drafted=drafted))
        baselines.append(record(qid, category, "vanilla", [[1] * sum(accepts)] * turns, [1.0 / turns] * turns,
                                cpu_share=cpu_share))
    return write_run(path, method, answers, baselines, **kw)


def vanilla_records(times: dict[int, float], tokens: int = 12) -> list[dict]:
    """Vanilla answers: one token per forward, `tokens` per turn (two turns for the MT-bench question)."""
    out = []
    for qid, category in QUESTIONS:
        turns = turns_of(category)
        out.append(record(qid, category, "vanilla", [[1] * (tokens - 1)] * turns, [times[qid] / turns] * turns))
    return out


BUDGET_QUESTIONS = [(321 + i, "qa") for i in range(10)]  # ten Question Answering questions
BUDGET_METHODS = {"pld": 2, "eagle2": 3}  # method -> tokens added per decode step


def budget_speedup(method: str, budget: int, question: int) -> float:
    """How many times faster than its interleaved vanilla `method` answered `question` at `budget` tokens: eagle2
    ahead at 128 tokens, pld at 256, each question off its method's figure by up to ±0.2."""
    base = {("pld", 128): 1.45, ("eagle2", 128): 1.6, ("pld", 256): 1.55, ("eagle2", 256): 1.5}[method, budget]
    return base + 0.1 * ((question * 7) % 5 - 2)


def vanilla_seconds(budget: int, question: int) -> float:
    """Vanilla's time for `budget` tokens of `question`: about 14 tokens/s, ±4% by question."""
    return budget / (14.0 * (1 + 0.02 * ((question * 3) % 5 - 2)))


def steps_of(tokens: int, per_step: int) -> list[int]:
    """Accept lengths of a turn of `tokens` new tokens (its prefill's first, then `per_step` a decode step)."""
    whole, rest = divmod(tokens - 1, per_step)
    return [per_step] * whole + ([rest] if rest else [])


def budget_runs(root: Path) -> None:
    """Two methods (BUDGET_METHODS) on one task (BUDGET_QUESTIONS) at two token budgets, 128 and 256, vanilla
    interleaved, every answer a full budget long: the runs behind docs/figures/report-leaderboard.png. At 256
    tokens eagle2's question 321 left vanilla at a numeric tie."""
    for budget in (128, 256):
        for method, per_step in BUDGET_METHODS.items():
            answers, baselines = [], []
            for qid, category in BUDGET_QUESTIONS:
                tie = budget == 256 and method == "eagle2" and qid == 321
                divergence = {"turn": 0, "position": 40, "logit_gap": 0.01, "numeric_tie": True} if tie else None
                seconds = vanilla_seconds(budget, qid)
                answers.append(record(qid, category, method, [steps_of(budget, per_step)],
                                      [seconds / budget_speedup(method, budget, qid)], exact_match=not tie,
                                      divergence=divergence))
                baselines.append(record(qid, category, "vanilla", [[1] * (budget - 1)], [seconds]))
            write_run(root / f"{method}-{budget}", method, answers, baselines, model="smollm2_135m",
                      dtype="float32", device_name="2-core CPU", max_new_tokens=budget, task="qa",
                      finished=f"2026-03-0{budget // 128}T09:00:00")
