"""`python -m bench.report <results_dir> --out <folder>`: the leaderboard and its plots (bench/report/render.py;
`specbench-report` is the same command), with other tools' results beside our runs (--vllm-bench-serve, --aiperf,
--spec-bench: bench/report/imports/)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.errors import exit_on_user_error
from bench.report import render
from bench.report.imports import load_imports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=render.__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="folder searched recursively for runs (e.g. results/runs)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="folder to write the report into")
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
    with exit_on_user_error():  # a bad file is refused before anything is written
        imported = load_imports(args.vllm_bench_serve, args.aiperf, args.spec_bench, args.spec_bench_baseline,
                                args.spec_bench_tokenizer)
    render.write_report(args.results_dir, args.out, imported)
    print((args.out / "leaderboard.md").read_text())
    print(f"report written to {args.out}/ (open {args.out / 'index.html'})", file=sys.stderr)


if __name__ == "__main__":
    main()
