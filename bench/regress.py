"""`python -m bench.regress PATH --baseline FILE`: the regression gate (bench/report/regress.py says what it checks;
`specbench-regress` is the same command). Exit status 0 passed, 1 regressed, 2 nothing to compare."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report import regress as gate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.regress", description=gate.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=gate.__doc__.split("\n\n", 1)[1])
    parser.add_argument("path", type=Path, help="a run folder, a results folder or a report folder")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="baseline JSON, e.g. results/baselines/<model>-<device>.json")
    parser.add_argument("--mat-tolerance", type=float, default=None,
                        help=f"relative drop of mean accepted tokens allowed (default: the file's, else "
                             f"{gate.DEFAULT_TOLERANCES['mean_accepted_tokens']})")
    parser.add_argument("--speedup-tolerance", type=float, default=None,
                        help=f"relative drop of speedup allowed (default: the file's, else "
                             f"{gate.DEFAULT_TOLERANCES['speedup']})")
    parser.add_argument("--allow-missing", action="store_true",
                        help="gate only what PATH holds: baseline entries absent from it are a note, not a failure")
    parser.add_argument("--update", action="store_true", help="write/merge the baseline from PATH instead of checking")
    args = parser.parse_args(argv)
    try:
        status = gate.regress(args.path, args.baseline, args.mat_tolerance, args.speedup_tolerance,
                              args.allow_missing, args.update)
    except gate.RegressError as err:
        print(f"regress: error: {err}", file=sys.stderr)
        status = 2
    sys.exit(status)


if __name__ == "__main__":
    main()
