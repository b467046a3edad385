"""One head, two engines: our engine and vLLM (its CPU build, launched by the harness: conf/server/vllm_cpu_*.yaml)
run the same EAGLE-3 head, the same SpS or PARD draft, DFlash drafter or SuffixDecoding as a chain of up to k
drafts, greedy, on the same prompts, each against its own baseline interleaved (python -m bench, one run at a time);
then per-position acceptance, #MAT and tokens/s side by side, and where the engines' per-position acceptance differs
by more than --tolerance.

    bash tools/build_vllm_cpu.sh      # once
    python -m bench.parity.engines [--k 3] [--task all] [--limit 5] [--max-new-tokens 128] [--heads eagle3,sps,pld]
    python -m bench.parity.engines --no-run ...    # compare the runs already made

Runs go to results/runs/cross_engine/<model>/<head>-k<k>/<engine>/ (resumed where they stopped); the report picks
them up (python -m bench.report results/runs/cross_engine) and records them (`--record cross_engine`): docs/parity.md's
tables (Same head, two engines).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.artifacts import PROJECT_ROOT
from bench.config import compose_config
from bench.records import read_jsonl
from bench.same_head import ENGINES, HEADS
from methods.dflash.checkpoints import published_copy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.parity.engines", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=3, help="drafts per step (a chain) in both engines")
    parser.add_argument("--heads", default="eagle3,sps", help=f"comma-separated, of {', '.join(HEADS)}")
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml (its dtype: both engines')")
    parser.add_argument("--task", default="all")
    parser.add_argument("--limit", type=int, default=5, help="questions per task")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--compile", choices=("on", "off"), default="on",
                        help="our engine's engine.compile (on: compiled forwards, as vLLM runs its model)")
    parser.add_argument("--tolerance", type=float, default=0.02, help="per-position acceptance gap that is flagged")
    parser.add_argument("--no-run", action="store_true", help="only compare the runs already in --out")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "results" / "runs" / "cross_engine",
                        help="the runs' folder (its record: python -m bench.report <out> --record cross_engine)")
    return parser.parse_args(argv)


def run_dir(args: argparse.Namespace, head: str, engine: str) -> Path:
    return args.out / args.model / f"{head}-k{args.k}" / engine


def bench_command(args: argparse.Namespace, head: str, engine: str) -> list[str]:
    """`python -m bench ...` for one head in one engine, greedy, on the shared prompts."""
    overrides = HEADS[head][ENGINES.index(engine)]
    published = dflash_published(args.model) if head == "dflash" else None
    filled = (o.format(k=args.k, k_plus_1=args.k + 1, k_minus_1=args.k - 1, dflash_published=published)
              for o in overrides)
    ours = [f"engine.compile={args.compile}"] if engine == "ours" else []
    return [sys.executable, "-m", "bench", *filled, *ours, f"model={args.model}",
            f"task={args.task}", f"task.limit={args.limit}", f"gen.max_new_tokens={args.max_new_tokens}",
            "gen.temperature=0", f"out_dir={run_dir(args, head, engine)}"]


def dflash_published(model: str) -> Path:
    """The published-layout copy of the DFlash drafter method=dflash runs on `model` (what vLLM loads)."""
    checkpoint = compose_config("method=dflash", f"model={model}").method.drafter.checkpoint
    return published_copy(PROJECT_ROOT / checkpoint)


def overall_row(folder: Path, head: str, engine: str, k: int) -> dict:
    """The run's overall summary row: per-position acceptance 1..k, #MAT, tokens/s of method and baseline."""
    summary = pd.read_csv(folder / "summary.csv")
    row = summary[summary.task == "overall"].iloc[0]
    positions = {f"pos{j}": row.get(f"accept_rate_pos{j}") for j in range(1, k + 1)}
    return {"head": head, "engine": engine, "#MAT": row.mean_accepted_tokens, **positions,
            "tok/s": row.tokens_per_s, "baseline tok/s": row.baseline_tokens_per_s, "speedup": row.speedup,
            "exact": row.exact_match}


def turn_steps(record: dict) -> list[tuple[list[int], list[int]]]:
    """(token ids, decode step lengths) of each turn of an answer record (accept_lengths holds every turn's, in
    order)."""
    choice, out, start = record["choices"][0], [], 0
    for ids, steps in zip(choice["token_ids"], choice["decoding_steps"]):
        out.append((ids, choice["accept_lengths"][start:start + steps]))
        start += steps
    return out


def shared_text(ours: Path, vllm: Path) -> tuple[int, int, dict[str, list[int]], tuple[int, int]]:
    """Over the turns whose tokens both engines produce alike (their greedy texts may part where float32 arithmetic
    differs): the turns compared and in all, each engine's accepted drafts per decode step on them, and
    (steps both start at the same position, how many of those accepted as many drafts in both): the same head on the
    same context must agree, whatever the steps before (a turn's last step, which the length limit may cut, left
    out)."""
    accepts: dict[str, list[int]] = {"ours": [], "vllm": []}
    turns = alike = shared = agreed = 0
    for ids, mine, other_ids, other in paired_turns(ours, vllm):
        turns += 1
        if ids != other_ids:
            continue
        alike += 1
        accepts["ours"] += [a - 1 for a in mine]
        accepts["vllm"] += [a - 1 for a in other]
        starts = [step_starts(lengths, len(ids)) for lengths in (mine, other)]
        common = starts[0].keys() & starts[1].keys()
        shared += len(common)
        agreed += sum(starts[0][p] == starts[1][p] for p in common)
    return alike, turns, accepts, (shared, agreed)


def paired_turns(ours: Path, vllm: Path):
    """(our token ids, our step lengths, vLLM's token ids, its step lengths) of every turn both engines answered."""
    theirs = {r["question_id"]: turn_steps(r) for r in read_jsonl(vllm / "answers.jsonl")}
    for record in read_jsonl(ours / "answers.jsonl"):
        for (ids, mine), (other_ids, other) in zip(turn_steps(record), theirs.get(record["question_id"], [])):
            yield ids, mine, other_ids, other


def accepting_steps_agree(ours: Path, vllm: Path) -> tuple[int, int]:
    """(turns both engines wrote alike, those whose steps that accepted a draft accepted as many, in order, the last
    such step left out). vLLM's per-request metrics list the steps that drafted, not where the steps that drafted
    nothing fell, so for a drafter that often drafts nothing (SuffixDecoding) step positions cannot be matched;
    the order of the accepting steps can. The last one is left out: at the length limit ours drafts only what still
    fits, vLLM drafts on and cuts the answer afterwards."""
    alike = agreed = 0
    for ids, mine, other_ids, other in paired_turns(ours, vllm):
        if ids == other_ids:
            alike += 1
            agreed += [n for n in mine if n > 1][:-1] == [n for n in other if n > 1][:-1]
    return alike, agreed


def step_starts(lengths: list[int], new_tokens: int) -> dict[int, int]:
    """{position a decode step starts at: its length}, the turn's last step left out (the prefill's token is
    position 0)."""
    starts, position = {}, 1
    for length in lengths:
        if position + length < new_tokens:
            starts[position] = length
        position += length
    return starts


def shared_rows(head: str, accepts: dict[str, list[int]], k: int) -> list[dict]:
    """Per-position acceptance of each engine over the turns both wrote alike (the comparison that can be fair)."""
    return [{"head": head, "engine": f"{engine}, same text", "#MAT": 1 + sum(steps) / len(steps) if steps else None,
             **{f"pos{j}": sum(a >= j for a in steps) / len(steps) if steps else None for j in range(1, k + 1)}}
            for engine, steps in accepts.items()]


def flag_gaps(table: pd.DataFrame, k: int, tolerance: float) -> list[str]:
    """One line per head and position where vLLM's acceptance on the shared text differs from ours by more than
    `tolerance`."""
    flagged = []
    for head, pair in table[table.engine.str.endswith("same text")].groupby("head", sort=False):
        ours, vllm = pair.iloc[0], pair.iloc[1]
        for j in range(1, k + 1):
            gap = vllm[f"pos{j}"] - ours[f"pos{j}"]
            if abs(gap) > tolerance:
                flagged.append(f"{head}: position {j} accepted at {ours[f'pos{j}']:.3f} in ours, "
                               f"{vllm[f'pos{j}']:.3f} in vLLM ({gap:+.3f}) on the same text")
    return flagged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    heads = [h for h in args.heads.split(",") if h]
    unknown = sorted(set(heads) - set(HEADS))
    if unknown:
        print(f"--heads: unknown {', '.join(unknown)}; choose from {', '.join(HEADS)}", file=sys.stderr)
        return 2
    rows, notes = [], []
    for head in heads:
        for engine in ENGINES:
            command = bench_command(args, head, engine)
            print("$ " + " ".join(command[1:]), flush=True)
            if not args.no_run and subprocess.run(command, cwd=PROJECT_ROOT).returncode != 0:
                print(f"{head} in {engine} failed (its output is above)", file=sys.stderr)
                return 1
            rows.append(overall_row(run_dir(args, head, engine), head, engine, args.k))
        dirs = run_dir(args, head, "ours"), run_dir(args, head, "vllm")
        alike, turns, accepts, steps = shared_text(*dirs)
        rows += shared_rows(head, accepts, args.k)
        notes.append(f"{head}: {alike} of {turns} turns have the same text in both engines; on them {steps[0]} steps "
                     f"start at the same position, {steps[1]} ({steps[1] / max(steps[0], 1):.1%}) accepting as "
                     f"many drafts in both; in {accepting_steps_agree(*dirs)[1]} the steps that accepted drafts "
                     f"accepted as many, in order (the last left out)")
    table = pd.DataFrame(rows)
    flagged = flag_gaps(table, args.k, args.tolerance)
    print(f"\nSame head, two engines: {args.model}, chain of k={args.k}, greedy, task={args.task} "
          f"limit={args.limit}, max_new_tokens={args.max_new_tokens}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(notes))
    print("\n".join(["", f"per-position acceptance differs by more than {args.tolerance:g}:", *flagged]) if flagged
          else f"\nper-position acceptance within {args.tolerance:g} for every head")
    return 0


if __name__ == "__main__":
    sys.exit(main())
