"""The long-input task (conf/task/long_inputs.yaml over tasks/data/long_inputs.jsonl): its buckets and prompts, the
builder's determinism, and how the work of the drafters that read the context grows with the input, counted in
Python lines the drafter executes (a count, not a timing: the same on any machine)."""
from __future__ import annotations

import json
import random
import sys

import numpy as np
import pytest

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from methods.lookahead import LookaheadDrafter
from methods.pld import PromptLookupDrafter
from methods.rest import RestDrafter
from methods.rest_datastore import write_datastore
from methods.samd import SamdDrafter
from tasks import check_question_file, load_questions
from tasks.build_long_inputs import BUCKETS, LONG_INPUTS_FILE, LOWEST_SHARE

SMOLLM2_WINDOW, DEFAULT_MAX_NEW_TOKENS = 8192, 1024


def committed_questions() -> list[dict]:
    return [json.loads(line) for line in LONG_INPUTS_FILE.read_text(encoding="utf-8").splitlines()]


def test_the_task_takes_five_prompts_per_bucket_and_limit_takes_the_first_of_each():
    questions = load_questions(compose_config("task=long_inputs").task)
    assert [q["category"] for q in questions] == [bucket for bucket in BUCKETS for _ in range(5)]
    first = load_questions(compose_config("task=long_inputs", "task.limit=1").task)
    assert [(q["question_id"], q["category"]) for q in first] == [
        (1101, "long_1k"), (1201, "long_2k"), (1401, "long_4k"), (1701, "long_7k")]
    assert all(len(q["turns"]) == 1 for q in questions)


def test_the_repository_s_task_files_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = load_questions(compose_config("task=long_inputs", "task.limit=1").task)
    assert [q["question_id"] for q in first] == [1101, 1201, 1401, 1701]
    assert len(load_questions(compose_config("task=repeated_agentic").task)) == 40


def test_every_prompt_lies_in_its_bucket_and_leaves_room_for_the_answer():
    check_question_file(LONG_INPUTS_FILE)  # raises at a bad line
    questions = committed_questions()
    for q in questions:
        most = BUCKETS[q["category"]]
        assert int(most * LOWEST_SHARE) <= q["prompt_tokens"] <= most, q["question_id"]
    assert max(q["prompt_tokens"] for q in questions) + DEFAULT_MAX_NEW_TOKENS <= SMOLLM2_WINDOW
    assert len({q["source"] for q in questions}) == len(questions)  # no source used twice
    kinds = [q["source"].removeprefix("spec_bench:").split(":")[0] for q in questions]
    assert kinds == ["sharegpt", "sharegpt", "summarization", "summarization", "rag"] * len(BUCKETS)
    assert LONG_INPUTS_FILE.stat().st_size < 1_000_000


@pytest.mark.real_model
def test_the_builder_remakes_the_committed_file_and_counts_tokens_as_a_run_does(tmp_path):
    from omegaconf import OmegaConf

    from bench.models import load_tokenizer
    from tasks.build_long_inputs import main
    from tasks.prompts import build_prompt, set_prompt_format

    main(["--out", str(tmp_path / "long_inputs.jsonl")])
    assert (tmp_path / "long_inputs.jsonl").read_bytes() == LONG_INPUTS_FILE.read_bytes()
    model_cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml")
    tokenizer = load_tokenizer(model_cfg)
    set_prompt_format(tokenizer)
    for q in committed_questions()[::5]:
        assert len(build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}])) == q["prompt_tokens"]


# --- where drafting work grows with the input ------------------------------------------------------------------------

METHODS_FOLDER = str(PROJECT_ROOT / "methods")


def lines_run(call) -> int:
    """Python lines executed in methods/ while `call()` runs (numpy's and torch's C work is not counted)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if not frame.f_code.co_filename.startswith(METHODS_FOLDER):
            return None
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def drafting_lines(drafter, prompt_tokens: int, steps: int = 20, vocab: int = 300, seed: int = 0) -> tuple[int, float]:
    """(lines of the turn's start and first proposal, mean lines of each later proposal) for a random prompt of
    `prompt_tokens` tokens over `vocab` ids, each step accepting three random tokens."""
    rng = random.Random(seed)
    context = [rng.randrange(vocab) for _ in range(prompt_tokens)]
    first = lines_run(lambda: (drafter.start(list(context)), drafter.propose(context, 32)))
    per_step = []
    for _ in range(steps):
        context.extend(rng.randrange(vocab) for _ in range(3))
        per_step.append(lines_run(lambda: drafter.propose(context, 32)))
    return first, sum(per_step) / steps


def rest_drafter(tmp_path) -> RestDrafter:
    corpus = np.random.default_rng(3).integers(0, 300, (400, 50)).tolist()
    return RestDrafter(datastore={"path": str(write_datastore(tmp_path / "store.idx", corpus))})


DRAFTERS = {  # the drafters that read the context itself (the others read the target's features or a draft model's)
    "pld": lambda tmp_path: PromptLookupDrafter(),
    "samd": lambda tmp_path: SamdDrafter(fallback="none"),
    "rest": rest_drafter,
    "lookahead": lambda tmp_path: LookaheadDrafter(),
}
# Whether the start of a turn reads the whole prompt (PLD's n-gram index, SAMD's automaton; REST reads its last
# 16 tokens, Lookahead samples guesses from it)
READS_THE_PROMPT = {"pld": True, "samd": True, "rest": False, "lookahead": False}


@pytest.mark.parametrize("method", DRAFTERS)
def test_a_step_s_drafting_work_does_not_grow_with_the_input(method, tmp_path):
    """1k against 7k prompt tokens: each later step costs about the same lines; the turn's start costs 7x where the
    drafter indexes the prompt, about the same where it does not."""
    drafting_lines(DRAFTERS[method](tmp_path), 100)  # fills module-level caches (Lookahead's window layouts)
    short_first, short_step = drafting_lines(DRAFTERS[method](tmp_path), 1000)
    long_first, long_step = drafting_lines(DRAFTERS[method](tmp_path), 7000)
    assert 0.67 < long_step / short_step < 1.5, (short_step, long_step)
    if READS_THE_PROMPT[method]:
        assert 5 < long_first / short_first < 9, (short_first, long_first)
    else:
        assert 0.67 < long_first / short_first < 1.5, (short_first, long_first)
