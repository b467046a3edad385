"""`python -m bench.parity [--methods m,...] [--list]`: each method's parity file (bench/parity/methods/<method>.py)
beside the reference implementation, through one protocol (bench/parity/protocol.py): both sides decode the same
prompt ids, greedily in float32, and each row gives both #MATs (tokens per target forward, the prefill included),
their relative difference and whether the tokens are equal (else the first divergence, and whether our target calls
it a numeric tie); notes (per-position acceptance, drafts compared step by step) are printed under the table. The
rows go to the committed record results/reference/parity/<model>/parity.csv, replacing the rows of the methods run;
docs/parity.md's tables are generated from it (`python -m bench.report --docs`). The reference code runs in side
environments made once in $SPECBENCH_CACHE (docs/parity.md); run it as `OMP_NUM_THREADS=1 python -m bench.parity`."""
from __future__ import annotations

import argparse
import ast
import csv
import datetime
import importlib
import os
import sys
import tempfile
from pathlib import Path

from bench.artifacts import PROJECT_ROOT

METHODS = Path(__file__).with_name("methods")
COLUMNS = ("parity_file", "method", "settings", "questions", "prompts", "max_new_tokens", "our_mat", "upstream_mat",
           "difference", "tokens_equal", "divergence_prompt", "divergence_token", "numeric_tie", "tie_distance",
           "notes", "date")


def parity_files() -> dict[str, str]:
    """{method: what its parity file compares it with (its AGAINST)}, from the files in bench/parity/methods/, read
    without importing them."""
    return {path.stem: against(ast.parse(path.read_text())) for path in sorted(METHODS.glob("*.py"))
            if path.stem != "__init__"}


def against(module: ast.Module) -> str:
    """The value of a module's `AGAINST = "..."`."""
    return next((node.value.value for node in module.body if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["AGAINST"]
                 and isinstance(node.value, ast.Constant)), "?")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=None, help="comma-separated (default: every parity file)")
    parser.add_argument("--list", action="store_true", help="list the parity files and what each compares, then stop")
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml (run in float32)")
    parser.add_argument("--questions", default="81,82", help="question ids (MT-bench: 81-160), both turns of each")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=DIR",
                        help="an upstream checkout elsewhere than its default: spec-bench, PARD, redrafter, fms-extras")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "results" / "reference" / "parity",
                        help="the record's folder (its <model>/parity.csv)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = parity_files()
    if args.list:
        print("\n".join(f"{name:16s} against {reference}" for name, reference in files.items()))
        return 0
    methods = args.methods.split(",") if args.methods else list(files)
    if unknown := [m for m in methods if m not in files]:
        print(f"error: --methods: no parity file for {', '.join(unknown)}; methods with one: {', '.join(files)}",
              file=sys.stderr)
        return 2
    import torch

    from bench.parity.protocol import parity_setup

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    setup = parity_setup(args.model, [int(q) for q in args.questions.split(",")], args.max_new_tokens,
                         dict(checkout.split("=", 1) for checkout in args.checkout))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [(method, row) for method in methods for row in
                importlib.import_module(f"bench.parity.methods.{method}").comparisons(setup, Path(tmp) / method)]
    made = {"questions": args.questions, "max_new_tokens": args.max_new_tokens, "date": str(datetime.date.today())}
    records = [{"parity_file": method, **made, **row.record(setup)} for method, row in rows]
    print(f"{len(setup.prompts)} prompts (MT-bench {args.questions}, both turns), {args.max_new_tokens} new tokens, "
          f"greedy, float32, {args.model}")
    print("| method | settings | our #MAT | upstream #MAT | difference | tokens equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(row.line(record) for (_, row), record in zip(rows, records)))
    print("\n".join(note for _, row in rows for note in row.notes))
    print(f"wrote {write_records(args.out / args.model / 'parity.csv', records, set(methods))}")
    return 0


def write_records(path: Path, records: list[dict], methods: set[str]) -> Path:
    """`records` into the CSV at `path`, in place of its rows of `methods` (the other methods' rows kept)."""
    kept = []
    if path.exists():
        with path.open() as f:
            kept = [row for row in csv.DictReader(f) if row["parity_file"] not in methods]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(kept + records)
    return path


if __name__ == "__main__":
    sys.exit(main())
