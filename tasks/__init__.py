"""Spec-Bench task suites: which question categories make each task, and how prompts are built."""
from __future__ import annotations

import glob
import json
import os
from collections.abc import Collection
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tasks.prompts import build_prompt

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
    shipped in tasks/data) or any dataset with `question_id`, `category` and `turns` columns. Local JSON files are
    checked line by line first: a bad line is a one-line ConfigError naming its file and line.
    """
    import datasets

    from bench.errors import ConfigError

    source = OmegaConf.to_container(cfg.source, resolve=True)
    if source.get("data_files") is None and source.get("path") == "json":
        source["data_files"] = str(QUESTIONS_FILE)
    elif isinstance(source.get("data_files"), str):
        source["data_files"] = in_repository(source["data_files"])
    if source.get("path") == "json":
        for path in local_files(source["data_files"]):
            check_question_file(path, source.get("field"))
    datasets.disable_progress_bars()
    try:
        rows = datasets.load_dataset(**source)
    except (datasets.exceptions.DatasetsError, FileNotFoundError, ConnectionError) as err:
        cause = err.__cause__ or err
        raise ConfigError(f"task.source={source}: datasets cannot load it ({type(cause).__name__}: "
                          f"{_first_line(cause)})") from err
    wanted = {task: TASK_CATEGORIES.get(task, (task,)) for task in cfg.tasks}
    taken: dict[str, int] = {task: 0 for task in wanted}
    questions = []
    for index, row in enumerate(rows):
        problem = question_problem(row)
        if problem:
            raise ConfigError(f"task.source={source} row {index}: {problem}")
        task = next((t for t, cats in wanted.items() if row["category"] in cats), None)
        if task is None or (cfg.limit is not None and taken[task] >= cfg.limit):
            continue
        taken[task] += 1
        questions.append({"question_id": row["question_id"], "category": row["category"], "turns": list(row["turns"])})
    if not questions:
        raise ConfigError(f"task '{cfg.name}' selected no questions (tasks={list(cfg.tasks)}, limit={cfg.limit}); "
                          f"set task.tasks to categories the source has")
    return questions


QUESTION_FIELDS = "question_id (an integer), category (a string) and turns (a list of strings)"


def question_problem(row) -> str | None:
    """What makes a question row unusable (a missing or mistyped field), or None when it is fine."""
    if not isinstance(row, dict):
        return f"a JSON object with {QUESTION_FIELDS} expected, not {type(row).__name__}"
    missing = [key for key in ("question_id", "category", "turns") if row.get(key) is None]
    if missing:
        return f"no {', '.join(repr(k) for k in missing)} (every question needs {QUESTION_FIELDS})"
    if not isinstance(row["question_id"], int) or isinstance(row["question_id"], bool):
        return f"question_id {row['question_id']!r} is not an integer"
    if not isinstance(row["category"], str):
        return f"category {row['category']!r} is not a string"
    turns = row["turns"]
    if isinstance(turns, str) or not isinstance(turns, (list, tuple)) or not turns \
            or not all(isinstance(t, str) for t in turns):
        return f"turns must be a non-empty list of strings, not {_clip(turns)}"
    return None


def in_repository(data_file: str) -> str:
    """A relative path that names no file here but one of the repository's (conf/task/ names tasks/data/<file>
    so): that file's absolute path, so a task runs from any directory; other paths as they are."""
    packaged = Path(__file__).parent.parent / data_file
    if Path(data_file).is_absolute() or "://" in data_file or glob.glob(data_file) or not packaged.is_file():
        return data_file
    return str(packaged)


def local_files(data_files) -> list[Path]:
    """The local files a `json` source's data_files names (a path or glob, a list of them, or a split -> paths
    dict); remote ones (with `://`) are left to datasets. ConfigError for a local pattern matching no file."""
    from bench.errors import ConfigError

    if isinstance(data_files, dict):
        patterns = [p for value in data_files.values() for p in (value if isinstance(value, list) else [value])]
    else:
        patterns = data_files if isinstance(data_files, list) else [data_files]
    files = []
    for pattern in map(str, patterns):
        if "://" in pattern:
            continue
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise ConfigError(f"task.source.data_files={pattern}: no such file (paths are relative to the current "
                              f"directory, {Path.cwd()})")
        files += [m for m in matches if m.is_file()]
    return files


def check_question_file(path: Path, field: str | None = None) -> None:
    """Raise ConfigError at the first bad line of a JSONL question file (not JSON, a field missing or mistyped, a
    question_id seen before). A JSON array file (or one read with `field`) is checked item by item."""
    from bench.errors import ConfigError

    text = path.read_text(encoding="utf-8", errors="replace")
    if field or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"task file {path} line {err.lineno}: not valid JSON ({err.msg}, column {err.colno})")
        items = data.get(field) if field and isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ConfigError(f"task file {path}: a list of questions expected"
                              + (f" under {field!r}" if field else ""))
        rows = [(f"item {i}", item) for i, item in enumerate(items)]
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise ConfigError(f"task file {path} line {number}: not valid JSON ({err.msg}, column {err.colno}): "
                                  f"{_clip(line)}")
    seen: dict[int, str] = {}
    for where, row in rows:
        problem = question_problem(row)
        if problem is None and row["question_id"] in seen:
            problem = f"question_id {row['question_id']} repeats {seen[row['question_id']]}'s (ids must be unique)"
        if problem:
            raise ConfigError(f"task file {path} {where}: {problem}")
        seen[row["question_id"]] = where


def _clip(value, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


# The plain format, for models without a chat template: "User: <turn>\n\nAssistant: <answer>\n\n...Assistant:".
# The raw format: the turns as they are, joined by blank lines; the model continues the last one.


def read_questions(categories: Collection[str] | None = None) -> list[dict]:
    """The shipped Spec-Bench questions in file order; of `categories` only, when given."""
    questions = [json.loads(line) for line in QUESTIONS_FILE.read_text().splitlines()]
    return [q for q in questions if categories is None or q["category"] in categories]


def first_turn_prompts(tokenizer, questions: list[dict]) -> list[list[int]]:
    """Prompts of the questions' first turns, through the chat template."""
    return [build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in questions]
