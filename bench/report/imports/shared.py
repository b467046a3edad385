"""What every import format shares: the row shape (ImportedRow: a leaderboard row with the columns its source fills,
NaN elsewhere) and the one-line refusals of a bad file (`<file>[ line N]: <what>`, a ConfigError)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.report.runs import SETTING_COLUMNS

OURS = "specbench"  # the `source` of our own runs' rows
POSITIONS = 5  # accept_rate_pos1..5, as our leaderboard's


@dataclass
class ImportedRow:
    """One leaderboard row (a task, or `overall`) of an imported result; NaN where its source says nothing."""

    source: str  # vllm-bench-serve, aiperf, spec-bench
    path: str  # the file(s) read
    method: str
    task: str = "overall"
    model: str | None = None
    batch_size: int | None = None  # a server benchmark's concurrency, where it was capped
    n_questions: float = math.nan  # questions or requests
    new_tokens: float = math.nan
    tokens_per_s: float = math.nan
    baseline_tokens_per_s: float = math.nan
    speedup: float = math.nan
    mean_accepted_tokens: float = math.nan
    accept_rates: list[float] = field(default_factory=list)  # share of steps accepting >= k drafts, k = 1, 2, ...

    def board_row(self) -> dict:
        """The row in the leaderboard's columns (bench.report.tables.board_of): a setting of its own per file, so
        it never pools with our runs or another import."""
        setting = {**dict.fromkeys(SETTING_COLUMNS), "model": self.model, "batch_size": self.batch_size}
        rates = {f"accept_rate_pos{k + 1}": rate for k, rate in enumerate(self.accept_rates[:POSITIONS])}
        return {"setting": json.dumps({**setting, "source": self.source, "file": self.path}, sort_keys=True),
                **setting, "source": self.source, "method": self.method, "task": self.task,
                "n_questions": self.n_questions, "new_tokens": self.new_tokens, "tokens_per_s": self.tokens_per_s,
                "baseline_tokens_per_s": self.baseline_tokens_per_s, "speedup": self.speedup,
                "mean_accepted_tokens": self.mean_accepted_tokens, **rates, "runs": self.path}


def refusal(path: Path, what: str, line: int | None = None) -> ConfigError:
    """The one-line error for a bad foreign file: `<file>[ line N]: <what>`."""
    return ConfigError(f"{path}{f' line {line}' if line else ''}: {what}")


_STEP = re.compile(r"(\w+)(?:\[(\d+)\])?")


def need(record: Any, name: str, path: Path, kind: str, line: int | None = None, number: bool | str = False) -> Any:
    """record's field `name` (dotted, with [i] for a list's item: `choices[0].wall_time`), or the refusal naming
    it: `<file>: not <kind>: no field <name>`; with `number`, it must be a number (`number="list"`: a list of
    numbers)."""
    value = record
    for part in name.split("."):
        key, index = _STEP.fullmatch(part).groups()
        if not isinstance(value, dict) or value.get(key) is None:
            raise refusal(path, f"not {kind}: no field {name}", line)
        value = value[key]
        if index is not None:
            if not isinstance(value, list) or len(value) <= int(index):
                raise refusal(path, f"not {kind}: no field {name}", line)
            value = value[int(index)]
    if number == "list" and not (isinstance(value, list) and all(_is_number(v) for v in value)):
        raise refusal(path, f"{name} is not a list of numbers: {value!r}", line)
    if number is True and not _is_number(value):
        raise refusal(path, f"{name} is not a number: {value!r}", line)
    return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_text(path: Path) -> str:
    """A foreign file's text; refused when it is missing or empty."""
    if not path.is_file():
        raise refusal(path, "no such file")
    text = path.read_text()
    if not text.strip():
        raise refusal(path, "empty file")
    return text


def json_lines(path: Path, kind: str) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON Lines file; a line that is not a JSON object is
    refused."""
    out = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise refusal(path, f"not {kind}: not JSON ({err.msg})", number) from None
        if not isinstance(value, dict):
            raise refusal(path, f"not {kind}: a JSON {type(value).__name__}, not an object", number)
        out.append((number, value))
    return out
