"""`python -m bench.report <results_dir> --out <folder>`: the leaderboard and its plots (bench/report/render.py;
`specbench-report` is the same command)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report import render


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=render.__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="folder searched recursively for runs (e.g. results/runs)")
    parser.add_argument("--out", type=Path, default=Path("report"), help="folder to write the report into")
    args = parser.parse_args(argv)
    render.write_report(args.results_dir, args.out)
    print((args.out / "leaderboard.md").read_text())
    print(f"report written to {args.out}/ (open {args.out / 'index.html'})", file=sys.stderr)


if __name__ == "__main__":
    main()
