"""Spec-Bench task suites: which question categories make each task, and how prompts are built."""
from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from omegaconf import DictConfig

QUESTIONS_FILE = Path(__file__).parent / "data" / "question.jsonl"

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASK_CATEGORIES: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH_CATEGORIES,
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}


def task_of(category: str) -> str:
    """The Spec-Bench task a question category belongs to."""
    for task, categories in TASK_CATEGORIES.items():
        if category in categories:
            return task
    return category


def load_questions(cfg: DictConfig) -> list[dict]:
    """Questions of the configured tasks, in file order, the first `limit` of each task.

    Loads through `datasets`, so `source` can name a local JSON file (the default: the 480 Spec-Bench questions
    shipped in tasks/data) or any dataset with `question_id`, `category` and `turns` columns.
    """
    import datasets

    source = dict(cfg.source)
    if source.get("data_files") is None and source.get("path") == "json":
        source["data_files"] = str(QUESTIONS_FILE)
    datasets.disable_progress_bars()
    rows = datasets.load_dataset(**source)
    wanted = {task: TASK_CATEGORIES.get(task, (task,)) for task in cfg.tasks}
    taken: dict[str, int] = {task: 0 for task in wanted}
    questions = []
    for row in rows:
        task = next((t for t, cats in wanted.items() if row["category"] in cats), None)
        if task is None or (cfg.limit is not None and taken[task] >= cfg.limit):
            continue
        taken[task] += 1
        questions.append({"question_id": row["question_id"], "category": row["category"], "turns": list(row["turns"])})
    if not questions:
        raise ValueError(f"task '{cfg.name}' selected no questions (tasks={list(cfg.tasks)}, limit={cfg.limit})")
    return questions


PROMPT_FORMATS = ("auto", "plain", "raw")
# The plain format, for models without a chat template: "User: <turn>\n\nAssistant: <answer>\n\n...Assistant:".
PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] | capitalize + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
# The raw format: the turns as they are, joined by blank lines; the model continues the last one.
RAW_TEMPLATE = "{% for m in messages %}{{ ('\\n\\n' if not loop.first else '') + m['content'] }}{% endfor %}"


def set_prompt_format(tokenizer, prompt_format: str = "auto", chat_template: str | None = None) -> str:
    """Give `tokenizer` the chat template that build_prompt renders with; returns which format that is.

    raw: RAW_TEMPLATE. Otherwise `chat_template` when given, else (auto) the tokenizer's own template, else the
    plain format. The plain and raw formats start with the BOS token where the tokenizer adds one to plain text.
    """
    if prompt_format == "raw":
        template = RAW_TEMPLATE
    elif chat_template:
        tokenizer.chat_template = chat_template
        return "chat_template"
    elif prompt_format == "auto" and tokenizer.chat_template:
        return "chat"
    else:
        template, prompt_format = PLAIN_TEMPLATE, "plain"
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("x").input_ids[:1] == [tokenizer.bos_token_id]
    tokenizer.chat_template = ("{{ bos_token }}" if adds_bos else "") + template
    return prompt_format


def build_prompt(tokenizer, conversation: list[dict]) -> list[int]:
    """Token ids of a chat so far, rendered with the tokenizer's chat template (see set_prompt_format), ready for
    the assistant's reply."""
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def read_questions(categories: Collection[str] | None = None) -> list[dict]:
    """The shipped Spec-Bench questions in file order; of `categories` only, when given."""
    questions = [json.loads(line) for line in QUESTIONS_FILE.read_text().splitlines()]
    return [q for q in questions if categories is None or q["category"] in categories]


def first_turn_prompts(tokenizer, questions: list[dict]) -> list[list[int]]:
    """Prompts of the questions' first turns, through the chat template."""
    return [build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in questions]
