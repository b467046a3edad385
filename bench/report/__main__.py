"""`python -m bench.report <results_dir> --out <folder>`: the leaderboard and its plots (bench/report/render.py;
`specbench-report` is the same command), with other tools' results beside our runs (--vllm-bench-serve, --aiperf,
--spec-bench: bench/report/imports/). `--record <experiment>` writes the runs' committed record instead
(bench/report/reference.py); `--docs [--check]` renders README's and docs' tables from the records
(bench/report/docs_blocks.py)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.errors import ConfigError, exit_on_user_error
from bench.report import render
from bench.report.docs_blocks import docs_files, shown_path, update_docs
from bench.report.imports import load_imports
from bench.report.reference import REFERENCE_DIR, write_record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=render.__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, nargs="?",
                        help="folder searched recursively for runs (e.g. results/runs)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="folder to write the report into")
    records = parser.add_argument_group("committed records and the docs' generated tables (docs/reporting.md)")
    records.add_argument("--record", metavar="EXPERIMENT",
                         help="write the runs' record to <reference>/EXPERIMENT/<host>/ (leaderboard.csv, meta.json) "
                              "instead of a report")
    records.add_argument("--docs", nargs="*", type=Path, metavar="FILE",
                         help="rewrite every generated table in README.md and docs/*.md (or the FILEs) from the "
                              "records")
    records.add_argument("--check", action="store_true",
                         help="with --docs: rewrite nothing; exit 1 with a line per table that differs from its "
                              "record or whose record is missing")
    records.add_argument("--reference", type=Path, default=REFERENCE_DIR, metavar="DIR",
                         help="the records' folder (default: results/reference)")
    imports = parser.add_argument_group("other tools' results, as rows beside our runs")
    imports.add_argument("--vllm-bench-serve", action="append", default=[], type=Path, metavar="FILE",
                         help="a `vllm bench serve --save-result` JSON file (repeatable)")
    imports.add_argument("--aiperf", action="append", default=[], type=Path, metavar="FILE",
                         help="an AIPerf profile_export.jsonl (aiperf profile --export-level records; repeatable)")
    imports.add_argument("--spec-bench", action="append", default=[], type=Path, metavar="FILE",
                         help="a Spec-Bench answer file, data/<bench>/model_answer/<model-id>.jsonl (repeatable)")
    imports.add_argument("--spec-bench-baseline", type=Path, metavar="FILE",
                         help="the Spec-Bench vanilla answer file the --spec-bench files' speedups are over "
                              "(speed.py's --base-path); without it they get no speedup")
    imports.add_argument("--spec-bench-tokenizer", metavar="DIR",
                         help="count the baseline's tokens as speed.py does, re-tokenising its answers with this "
                              "tokenizer (default: its new_tokens)")
    args = parser.parse_args(argv)
    if args.docs is not None:
        docs(args.docs or docs_files(), args.reference, args.check)
        return
    if args.results_dir is None:
        parser.error("the results_dir argument is required (or --docs)")
    if args.record:
        with exit_on_user_error():
            command = shlex.join(["python", "-m", "bench.report", *(sys.argv[1:] if argv is None else argv)])
            folder = write_record(args.results_dir, args.record, args.reference, command)
        print(f"record written to {shown_path(folder)}/ (leaderboard.csv, meta.json); then: python -m bench.report "
              f"--docs")
        return
    with exit_on_user_error():  # a bad file is refused before anything is written
        imported = load_imports(args.vllm_bench_serve, args.aiperf, args.spec_bench, args.spec_bench_baseline,
                                args.spec_bench_tokenizer)
    render.write_report(args.results_dir, args.out, imported)
    print((args.out / "leaderboard.md").read_text())
    print(f"report written to {args.out}/ (open {args.out / 'index.html'})", file=sys.stderr)


def docs(files: list[Path], reference: Path, check: bool) -> None:
    """--docs: every block rendered (or, with `check`, compared); a line per problem and exit 1 where there is one."""
    with exit_on_user_error():
        if missing := [str(f) for f in files if not f.is_file()]:
            raise ConfigError(f"no such file: {', '.join(missing)}")
        problems, notes = update_docs(files, reference, check)
    for line in notes:
        print(f"note: {line}")
    for line in problems:
        print(line)
    if problems:
        sys.exit(1)
    waiting = f"; {len(notes)} wait for their record" if notes else ""
    print(f"{len(files)} files {'checked' if check else 'rendered'}: no block differs from its record{waiting}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
