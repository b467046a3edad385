"""One head, two engines: our engine and vLLM (its CPU build, launched by the harness: conf/server/vllm_cpu_*.yaml)
run the same EAGLE-3 head and the same SpS draft as a chain of k drafts, greedy, on the same prompts, each against its
own baseline interleaved (python -m bench, one run at a time); then per-position acceptance, #MAT and tokens/s side
by side, and where the engines' per-position acceptance differs by more than --tolerance.

    bash benchmarks/build_vllm_cpu.sh      # once
    python -m benchmarks.cross_engine [--k 3] [--task all] [--limit 5] [--max-new-tokens 128] [--heads eagle3,sps]

Runs go to results/cross_engine/<model>/<head>-k<k>/<engine>/ (resumed where they stopped); the report picks them up
(python -m bench.report results/cross_engine). Differences and their causes: docs/parity.md (Same head, two engines).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.artifacts import PROJECT_ROOT

# Per head: our engine's method as a chain of k drafts, and the vLLM server loading the same head or draft.
HEADS = {
    "eagle3": (["method=eagle3", "method.drafter.depth={k}", "method.drafter.top_k=1",
                "method.drafter.total_token={k}"],
               ["backend=server", "server=vllm_cpu_eagle3", "server.num_speculative_tokens={k}"]),
    "sps": (["method=sps", "method.drafter.num_draft_tokens={k}", "method.drafter.adaptive=false"],
            ["backend=server", "server=vllm_cpu_draft", "server.num_speculative_tokens={k}"]),
}
ENGINES = ("ours", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=3, help="drafts per step (a chain) in both engines")
    parser.add_argument("--heads", default="eagle3,sps", help=f"comma-separated, of {', '.join(HEADS)}")
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml (its dtype: both engines')")
    parser.add_argument("--task", default="all")
    parser.add_argument("--limit", type=int, default=5, help="questions per task")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tolerance", type=float, default=0.02, help="per-position acceptance gap that is flagged")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "results" / "cross_engine")
    return parser.parse_args(argv)


def run_dir(args: argparse.Namespace, head: str, engine: str) -> Path:
    return args.out / args.model / f"{head}-k{args.k}" / engine


def bench_command(args: argparse.Namespace, head: str, engine: str) -> list[str]:
    """`python -m bench ...` for one head in one engine, greedy, on the shared prompts."""
    overrides = HEADS[head][ENGINES.index(engine)]
    return [sys.executable, "-m", "bench", *(o.format(k=args.k) for o in overrides), f"model={args.model}",
            f"task={args.task}", f"task.limit={args.limit}", f"gen.max_new_tokens={args.max_new_tokens}",
            "gen.temperature=0", f"out_dir={run_dir(args, head, engine)}"]


def overall_row(folder: Path, head: str, engine: str, k: int) -> dict:
    """The run's overall summary row: per-position acceptance 1..k, #MAT, tokens/s of method and baseline."""
    summary = pd.read_csv(folder / "summary.csv")
    row = summary[summary.task == "overall"].iloc[0]
    positions = {f"pos{j}": row.get(f"accept_rate_pos{j}") for j in range(1, k + 1)}
    return {"head": head, "engine": engine, "#MAT": row.mean_accepted_tokens, **positions,
            "tok/s": row.tokens_per_s, "baseline tok/s": row.baseline_tokens_per_s, "speedup": row.speedup,
            "exact": row.exact_match}


def side_by_side(rows: list[dict], k: int, tolerance: float) -> tuple[pd.DataFrame, list[str]]:
    """The rows as a table, and one line per head and position where the engines differ by more than `tolerance`."""
    table, flagged = pd.DataFrame(rows), []
    for head, pair in table.groupby("head", sort=False):
        if len(pair) != 2:
            continue
        ours, vllm = pair.iloc[0], pair.iloc[1]
        for j in range(1, k + 1):
            gap = vllm[f"pos{j}"] - ours[f"pos{j}"]
            if abs(gap) > tolerance:
                flagged.append(f"{head}: position {j} accepted at {ours[f'pos{j}']:.3f} in ours, "
                               f"{vllm[f'pos{j}']:.3f} in vLLM ({gap:+.3f})")
    return table, flagged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    heads = [h for h in args.heads.split(",") if h]
    unknown = sorted(set(heads) - set(HEADS))
    if unknown:
        print(f"--heads: unknown {', '.join(unknown)}; choose from {', '.join(HEADS)}", file=sys.stderr)
        return 2
    rows = []
    for head in heads:
        for engine in ENGINES:
            command = bench_command(args, head, engine)
            print("$ " + " ".join(command[1:]), flush=True)
            if subprocess.run(command, cwd=PROJECT_ROOT).returncode != 0:
                print(f"{head} in {engine} failed (its output is above)", file=sys.stderr)
                return 1
            rows.append(overall_row(run_dir(args, head, engine), head, engine, args.k))
    table, flagged = side_by_side(rows, args.k, args.tolerance)
    print(f"\nSame head, two engines: {args.model}, chain of k={args.k}, greedy, task={args.task} "
          f"limit={args.limit}, max_new_tokens={args.max_new_tokens}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(["", f"per-position acceptance differs by more than {args.tolerance:g}:", *flagged]) if flagged
          else f"\nper-position acceptance within {args.tolerance:g} for every head")
    return 0


if __name__ == "__main__":
    sys.exit(main())
