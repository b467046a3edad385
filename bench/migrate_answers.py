"""`python -m bench.migrate_answers PATH...`: rewrite answer files (*.jsonl, searched under folders) written before
records carried `"format"` into the current layout (bench/records.py: decode steps only), so that Spec-Bench's own
evaluation/speed.py reads them as `bench` does. Files already current are left untouched; a line that is not JSON
(cut off by an interrupted run) is kept as it is."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.records import RECORD_FORMAT, in_current_format


def migrate_text(text: str) -> tuple[str, int]:
    """The JSONL `text` with every answer record in RECORD_FORMAT, and how many lines changed."""
    lines, changed = [], 0
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            lines.append(line)
            continue
        current = in_current_format(record)
        changed += current is not record
        lines.append(json.dumps(current) if current is not record else line)
    return "".join(f"{line}\n" for line in lines), changed


def migrate_file(path: Path) -> int:
    """Rewrite `path` in place (through a temporary file) when any line changes; the number of lines changed."""
    text, changed = migrate_text(path.read_text())
    if changed:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.migrate_answers", description=__doc__)
    parser.add_argument("paths", type=Path, nargs="+", help="answer files, or folders searched for *.jsonl")
    args = parser.parse_args(argv)
    files = [f for p in args.paths for f in (sorted(p.rglob("*.jsonl")) if p.is_dir() else [p])]
    for path in files:
        changed = migrate_file(path)
        if changed:
            print(f"{path}: {changed} record(s) rewritten in format {RECORD_FORMAT}")
    print(f"migrate_answers: {len(files)} file(s) checked")


if __name__ == "__main__":
    main()
