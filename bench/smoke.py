"""`python -m bench.smoke [--out results/smoke] [--baseline FILE] [--update] [override ...]`: the CI smoke benchmark.

Runs every method of conf/method/*.yaml (vanilla first) on a few questions of every task with short greedy
generations (task=all task.limit=1 gen.max_new_tokens=32 device=cpu datastore.auto_build=false, SmolLM2-135M by
default; extra Hydra overrides are appended), in one process, one method after the other (a compiled one,
engine.compile=on, in a process of its own: bench/measure/own_process.py). A method whose artifacts are missing
(a datastore, trained heads, a draft model: bench.errors.MissingArtifactError) is skipped with its fix printed; any
other error fails the smoke. Then writes the report (<out>/report) and checks it with bench.regress
against the committed baseline (skipped methods may be absent from the runs). `--update` writes the baseline instead.
Last, one bfloat16 run (BFLOAT16_CHECK: EAGLE-2 on 3 MT-bench questions, 64 tokens, model=smollm2_135m_bf16; not in
the report or the baseline): every question that leaves vanilla's output must do so at a numeric tie proven by the
float32 re-check, else the smoke fails. On a CPU without bfloat16 instructions it runs anyway
(+model.allow_slow_bfloat16=true): it checks exactness, not speed.
Exit status: 0 passed, 1 a method failed or regressed, 2 nothing to compare (no baseline yet, say).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
import traceback
from pathlib import Path

from bench.artifacts import PROJECT_ROOT
from bench.config import CONF_DIR, compose_config, config_choices, unknown_choice, unknown_choices, unknown_keys
from bench.errors import MissingArtifactError
from bench.report.regress import RegressError, regress
from bench.report.render import write_report

# The smoke never builds artifacts: without a datastore REST is skipped (CI passes a small one, see .ci/run).
DEFAULT_OVERRIDES = ["task=all", "task.limit=1", "gen.max_new_tokens=32", "device=cpu", "warmup_tokens=4",
                     "++datastore.auto_build=false"]
DEFAULT_BASELINE = PROJECT_ROOT / "results" / "baselines" / "smollm2_135m-cpu.json"
# method, overrides: MT-bench's short prompts, as bfloat16 prefill is slow on a CPU without bfloat16 instructions
BFLOAT16_CHECK = ("eagle2", ["model=smollm2_135m_bf16", "+model.allow_slow_bfloat16=true", "task=mt_bench",
                             "task.limit=3", "gen.max_new_tokens=64"])
MARKER = ".smoke"  # marks a folder this script made, so that it may wipe it on the next run


def available_methods(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every method with a config in conf_dir/method/, vanilla first (it is the cheapest and its failure explains
    the others')."""
    return sorted(config_choices("method", conf_dir), key=lambda name: name != "vanilla")


def fresh_folder(out: Path) -> None:
    """Empty `out` if this script made it; refuse to touch a folder it did not make."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise SystemExit(f"error: {out} exists and was not made by bench.smoke; pass another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by python -m bench.smoke; emptied on its next run\n")


def run_method(method: str, out_dir: Path, overrides: list[str]) -> None:
    """One `python -m bench method=<method> ...` run, in this process, or a compiled one in a process of its own
    (bench/measure/own_process.py: a compiled run's graphs would stay in this one)."""
    import torch

    from bench.measure.own_process import run_in_own_process
    from bench.measure.run import run
    from bench.settings import compile_choice

    cfg = compose_config(f"method={method}", *overrides, f"out_dir={out_dir}")
    if compile_choice(cfg)[0]:
        run_in_own_process(cfg, torch.get_num_threads())
    else:
        run(cfg)


def bfloat16_check(out: Path, overrides: list[str]) -> str | None:
    """BFLOAT16_CHECK's run under `out`; None when every divergence is a float32-proven numeric tie, else what
    failed."""
    from bench.records import read_jsonl

    method, extra = BFLOAT16_CHECK
    print(f"\n=== smoke: {method} in bfloat16 (exactness against the float32 re-check) ===", flush=True)
    try:
        replaced = {o.split("=", 1)[0] for o in extra}
        run_method(method, out, [*(o for o in overrides if o.split("=", 1)[0] not in replaced), *extra])
    except MissingArtifactError as err:
        print(f"skipped the bfloat16 check: {err}")
        return None
    except Exception:  # noqa: BLE001 - reported as the check's failure
        return traceback.format_exc()
    answers = read_jsonl(out / "answers.jsonl")
    diverged = [a for a in answers if not a["exact_match"]]
    ties = [a for a in diverged if (a.get("divergence") or {}).get("numeric_tie")]
    bad = [a for a in diverged if not (a.get("divergence") or {}).get("numeric_tie")]
    print(f"bfloat16 check: {len(answers)} questions, {len(answers) - len(ties) - len(bad)} exact, {len(ties)} "
          f"numeric tie(s) proven in float32, {len(bad)} failure(s)")
    if bad:
        return "; ".join(f"question {a['question_id']}: {a['divergence']}" for a in bad)
    return None


def smoke(out: Path, methods: list[str], overrides: list[str], baseline: Path, update: bool = False) -> int:
    fresh_folder(out)
    started = time.time()
    ran, skipped, failed = [], {}, {}
    for method in methods:
        began = time.time()
        print(f"\n=== smoke: {method} ===", flush=True)
        try:
            run_method(method, out / "runs" / method, overrides)
            ran.append(method)
        except MissingArtifactError as err:
            skipped[method] = str(err)
        except Exception:  # the smoke goes on to the other methods, then fails
            failed[method] = traceback.format_exc()
        print(f"=== smoke: {method}: {'ran' if method in ran else 'skipped' if method in skipped else 'FAILED'} "
              f"in {time.time() - began:.0f} s ===", flush=True)

    print("\n=== smoke: summary ===")
    for method, message in skipped.items():
        print(f"skipped {method}: {message}")
    for method, trace in failed.items():
        print(f"FAILED {method}:\n{trace}")
    status = 1 if failed else 0
    if ran:
        write_report(out / "runs", out / "report")
        print((out / "report" / "leaderboard.md").read_text())
        try:
            status = max(status, regress(out / "report", baseline, allow_missing=set(skipped), update=update))
        except RegressError as err:
            print(f"regress: error: {err}\n(write the baseline with: python -m bench.smoke --update "
                  f"--baseline {baseline})")
            status = 2
    else:
        print("smoke: no method ran")
        status = 2
    if not any(o.startswith(("model=", "method=")) for o in overrides):
        problem = bfloat16_check(out / "bfloat16" / BFLOAT16_CHECK[0], overrides)
        if problem is not None:
            print(f"FAILED the bfloat16 check: divergences that are not numeric ties: {problem}")
            status = max(status, 1)
    print(f"smoke: {len(ran)} ran ({', '.join(ran)}), {len(skipped)} skipped, {len(failed)} failed, "
          f"{time.time() - started:.0f} s; exit {status}")
    return status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.smoke", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, after " + " ".join(DEFAULT_OVERRIDES))
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "results" / "smoke",
                        help="folder for runs/ and report/ (emptied first if a smoke made it)")
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods (default: every conf/method/*.yaml: "
                             + ",".join(available_methods()) + ")")
    parser.add_argument("--update", action="store_true", help="write/merge the baseline from this smoke run")
    args = parser.parse_args(argv)
    known = available_methods()
    methods = args.methods.split(",") if args.methods else known
    if strays := [o for o in args.overrides if "=" not in o and not o.startswith("~")]:  # `--methods a b` leaves b here
        hint = (f"; --methods takes one comma-separated list: --methods {','.join([*methods, *strays])}"
                if all(o in known for o in strays) else "")
        parser.error(f"not a Hydra override (key=value): {' '.join(strays)}{hint}")
    overrides = [*DEFAULT_OVERRIDES, *args.overrides]
    if problems := [unknown_choice("method", m) for m in methods if m not in known] + unknown_choices(overrides) \
            + unknown_keys("config", [f"method={methods[0]}", *overrides]):
        parser.error("; ".join(problems))
    sys.exit(smoke(args.out, methods, overrides, args.baseline, args.update))


if __name__ == "__main__":
    main()
