"""The generated tables of README.md and docs/*.md: each lies between two markers, rendered from a committed record
(results/reference/<experiment>/<host>/, bench/report/reference.py) by the report's own table functions.

    <!-- specbench:table experiment=reference_fp32 view=leaderboard -->
    ...rewritten by `python -m bench.report --docs`, never edited by hand...
    <!-- /specbench:table -->

Attributes: `experiment` (required); `host` (the record's machine label; may be left out while the experiment has
one record); `view`: `leaderboard` (Spec-Bench's table, as leaderboard.md has it), `acceptance` (acceptance by draft
position), `cost` (where the time goes, predicted speedup), `buckets` (speedup and #MAT per input-length bucket,
long inputs) or `step_cost` (the cross-engine record's heads at one step cost, bench/report/step_cost.py: one table of
the whole record); `allow-missing`: while the record is still to be made,
the block holds a one-line placeholder and `--check` reports it without failing. `experiment=parity` reads
bench.parity's record instead (bench/report/parity_record.py): `methods=a,b` its rows of those parity files, `model`
the model's record. `python -m bench.report --docs --check` rewrites nothing and exits 1 with one line per block that
differs from its record or whose record is missing. Text outside the blocks is never touched; markers inside ```
fences are text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.artifacts import PROJECT_ROOT
from bench.errors import ConfigError
from bench.report.parity_record import (
    PARITY,
    PARITY_FILE,
    parity_caption,
    parity_folder,
    parity_markdown,
    read_parity,
)
from bench.report.reference import BOARD_FILE, read_record
from bench.report.regimes import bucket_table, bucket_text
from bench.report.step_cost import step_cost_table, step_cost_text
from bench.report.tables import acceptance_table, acceptance_text, cost_table, leaderboard_markdown, markdown, rank_note

OPEN = re.compile(r"<!-- specbench:table (?P<attributes>[^>]*?) ?-->")
CLOSE = "<!-- /specbench:table -->"
FIX = "python -m bench.report --docs"


def _acceptance(board: pd.DataFrame) -> str:
    table = acceptance_table(board)
    rank = rank_note(table)
    return markdown(acceptance_text(table)) + (f"\n\n{rank}" if rank else "")


VIEWS = {"leaderboard": leaderboard_markdown, "acceptance": _acceptance,
         "cost": lambda board: markdown(cost_table(board)),
         "buckets": lambda board: markdown(bucket_text(bucket_table(board))),
         "step_cost": lambda settings: markdown(step_cost_text(step_cost_table(settings)))}
WHOLE_RECORD_VIEWS = {"step_cost"}  # views of every setting of the record at once (one table), not one per setting
ATTRIBUTES = {"experiment", "host", "view", "allow-missing", "methods", "model"}


@dataclass
class Block:
    """One marked block: where it is (its opening marker's line, 1-based; its inner lines' slice) and what it asks."""

    line: int
    start: int
    end: int
    attributes: dict[str, str]

    @property
    def name(self) -> str:
        return " ".join(k if v == "" else f"{k}={v}" for k, v in self.attributes.items())


def shown_path(path: Path) -> str:
    """A path as the messages name it: relative to the checkout where it lies in it."""
    path = Path(path).absolute()
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def parse_attributes(text: str, where: str) -> dict[str, str]:
    attributes = dict(word.partition("=")[::2] for word in text.split())
    problems = [f"{where}: unknown attribute {key} (known: {', '.join(sorted(ATTRIBUTES))})"
                for key in attributes if key not in ATTRIBUTES]
    if "experiment" not in attributes:
        problems.append(f"{where}: a block names its record's experiment=<name>")
    if attributes.get("view", "leaderboard") not in VIEWS:
        problems.append(f"{where}: view={attributes['view']}: views are {', '.join(VIEWS)}")
    if problems:
        raise ConfigError("\n".join(problems))
    return attributes


def find_blocks(lines: list[str], file: str) -> list[Block]:
    """The marked blocks of a file's lines (outside ``` fences); a marker out of place is refused (ConfigError)."""
    blocks, opened, fenced = [], None, False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        opening = OPEN.fullmatch(stripped)
        if fenced or not (opening or stripped == CLOSE):
            continue
        where = f"{file}:{i + 1}"
        if opening and opened is None:
            opened = Block(i + 1, i + 1, -1, parse_attributes(opening["attributes"], where))
        elif stripped == CLOSE and opened is not None:
            opened.end = i
            blocks.append(opened)
            opened = None
        else:
            raise ConfigError(f"{where}: {'a block opens inside another' if opening else 'a block closes unopened'}")
    if opened is not None:
        raise ConfigError(f"{file}:{opened.line}: block {opened.name} is not closed ({CLOSE})")
    return blocks


def record_folder(attributes: dict[str, str], reference_dir: Path) -> Path | None:
    """The record a block names: reference_dir/<experiment>/<host>, or the experiment's only record when no host is
    named; None when there is none."""
    experiment = Path(reference_dir) / attributes["experiment"]
    if "host" in attributes:
        folder = experiment / attributes["host"]
        return folder if (folder / BOARD_FILE).is_file() else None
    hosts = sorted(p.parent for p in experiment.glob(f"*/{BOARD_FILE}"))
    if len(hosts) > 1:
        raise ConfigError(f"{shown_path(experiment)} holds records of several machines "
                          f"({', '.join(p.name for p in hosts)}): name one with host=<label>")
    return hosts[0] if hosts else None


CAPTION_COMMANDS = 3  # a record made by more commands names them in its meta.json, not above every table


def caption(folder: Path, meta: dict, board: pd.DataFrame) -> str:
    """The line above a generated table: which record, what it was measured on, when and by which commands (up to
    CAPTION_COMMANDS, else where they are listed)."""
    first = board.iloc[0].to_dict()
    counts = sorted({int(n) for n in board[board.task != "overall"].n_questions})
    questions = f"{counts[0]} question{'s' * (counts != [1])}" if len(counts) == 1 else \
        f"{counts[0]}-{counts[-1]} questions"
    temperature = float(first["temperature"])
    decoding = "greedy" if temperature == 0 else f"temperature {temperature:g}"
    dates = sorted({str(meta.get(k) or "")[:10] for k in ("first_started", "last_finished")} - {""})
    threads = f", {meta['cpu_threads']} threads" if meta.get("cpu_threads") else ""
    listed = meta.get("commands", [])
    commands = "; ".join(f"`{c}`" for c in listed) if len(listed) <= CAPTION_COMMANDS else \
        f"the {len(listed)} commands listed in `{shown_path(folder)}/meta.json`"
    return (f"Generated by `{FIX}` from `{shown_path(folder)}/` (do not edit by hand): {first['model']}, "
            f"{first['dtype']}, {first['device_name']} ({first['device']}{threads}), {decoding}, max_new_tokens "
            f"{int(first['max_new_tokens'])}, {questions} per task, torch {meta.get('torch')}, {' to '.join(dates)}"
            + (f"; made with {commands}." if commands else "."))


# Experiments made by a command of their own rather than a conf/experiment/<name>.yaml sweep; their runs also go to
# results/runs/<experiment>/.
MADE_BY = {"cross_engine": "python -m bench.parity.engines --k 3 --heads eagle3,sps,pld --task all --limit 3 "
                           "--max-new-tokens 128"}


def how_to_make(experiment: str) -> str:
    """The commands that make an experiment's record (its runs go to results/runs/<experiment>/)."""
    if experiment == PARITY:
        return f"run `OMP_NUM_THREADS=1 python -m bench.parity`, then `{FIX}`"
    run = (f"`{MADE_BY[experiment]}` on a quiet machine" if experiment in MADE_BY else
           f"`python -m bench +experiment={experiment} -m` on a quiet machine (conf/experiment/{experiment}.yaml lists "
           f"every command)")
    return f"run {run}, then `python -m bench.report results/runs/{experiment} --record {experiment}` and `{FIX}`"


def placeholder(attributes: dict[str, str]) -> str:
    """A block's one line while its record is missing."""
    return f"*No record yet: {how_to_make(attributes['experiment'])}.*"


def render_parity(block: Block, reference_dir: Path) -> tuple[str, Path | None]:
    """An `experiment=parity` block: bench.parity's rows of its `methods` (every method when none are named)."""
    folder = parity_folder(reference_dir, block.attributes.get("model"))
    wanted = block.attributes.get("methods")
    rows = [] if folder is None else [r for r in read_parity(folder) if wanted is None
                                      or r["parity_file"] in wanted.split(",")]
    if not rows:
        return f"\n{placeholder(block.attributes)}\n", None
    return f"\n{parity_caption(folder, rows, FIX, shown_path(folder))}\n\n{parity_markdown(rows)}\n", folder


def render(block: Block, reference_dir: Path) -> tuple[str, Path | None]:
    """A block's content from its record, and the record's folder (None, and a placeholder, where it is missing)."""
    if block.attributes["experiment"] == PARITY:
        return render_parity(block, reference_dir)
    folder = record_folder(block.attributes, reference_dir)
    if folder is None:
        return f"\n{placeholder(block.attributes)}\n", None
    settings, meta = read_record(folder)
    name = block.attributes.get("view", "leaderboard")
    view = VIEWS[name]
    if name in WHOLE_RECORD_VIEWS:
        return (f"\nGenerated by `{FIX}` from `{shown_path(folder)}/` (do not edit by hand): every setting of the "
                f"record above, {str(meta.get('last_finished') or '')[:10]}.\n\n{view(settings)}\n", folder)
    tables = "\n\n".join(f"{caption(folder, meta, board)}\n\n{view(board)}" for board in settings)
    return f"\n{tables}\n", folder  # blank lines around: the markers never join a table or a paragraph


def update_file(path: Path, reference_dir: Path, check: bool) -> tuple[list[str], list[str]]:
    """Render every block of one file from its record: rewritten (unless `check`), or compared. Returns (problems,
    notes): a line per block that differs or whose record is missing; notes for missing records a block allows."""
    file = shown_path(path)
    lines = path.read_text().split("\n")
    problems, notes, out, done = [], [], [], 0
    for block in find_blocks(lines, file):
        content, folder = render(block, reference_dir)
        where = f"{file}:{block.line}: block {block.name}"
        allowed, experiment = "allow-missing" in block.attributes, block.attributes["experiment"]
        if folder is None:
            root, named = shown_path(Path(reference_dir) / experiment), block.attributes.get
            record = (f"rows of {named('methods', 'any method')} in {root}/{named('model', '<model>')}/{PARITY_FILE}"
                      if experiment == PARITY else f"record {root}/{named('host', '<host>')}/")
            missing = f"{where}: no {record} (make it: {how_to_make(experiment)})"
            (notes if allowed else problems).append(missing)
        if check and lines[block.start:block.end] != content.split("\n") and (folder or allowed):
            problems.append(f"{where} differs from {shown_path(folder) if folder else 'its placeholder'}: run {FIX}")
        out += [*lines[done:block.start], *content.split("\n")]
        done = block.end
    text = "\n".join(out + lines[done:])
    if not check and text != path.read_text():
        path.write_text(text)
    return problems, notes


def docs_files(root: Path = PROJECT_ROOT) -> list[Path]:
    """The files whose blocks `--docs` renders: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def update_docs(files: list[Path], reference_dir: Path, check: bool) -> tuple[list[str], list[str]]:
    """update_file over `files`: every problem and note, in file order."""
    problems, notes = [], []
    for path in files:
        found, noted = update_file(path, reference_dir, check)
        problems += found
        notes += noted
    return problems, notes
