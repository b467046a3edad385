"""t(L)/t(1) of the target in float32 and in bfloat16, side by side in one process: how much verifying L tokens costs
against decoding one, the number that decides whether speculation can pay (docs/bfloat16.md).

    OMP_NUM_THREADS=2 python -m studies.dtype_profile [--context 256] [--lengths 1,2,4,8,16,32,64] [--repeats 7]

Both copies of the target (conf/model/<--model>.yaml, loaded once per dtype) run one forward over L new tokens after
`--context` cached tokens; the two dtypes alternate for every L and repeat (median of `--repeats`), so a change in
machine load hits both. Writes a CSV and a plot (t(L)/t(1) against L, one line per dtype) to --out. Time it on a
quiet machine only; it prints whether the CPU has bfloat16 instructions (AMX-BF16, AVX512-BF16).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from bench.artifacts import PROJECT_ROOT  # noqa: E402
from bench.models import cpu_bfloat16_support, load_model  # noqa: E402
from bench.planning.profile import device_name  # noqa: E402

DTYPES = ("float32", "bfloat16")


@torch.inference_mode()
def forward_seconds(model, context: int, length: int) -> float:
    """Seconds of one forward over `length` new tokens after `context` cached ones (the cache made untimed)."""
    ids = torch.randint(100, 1000, (1, context + length))
    cache = model(input_ids=ids[:, :context], use_cache=True).past_key_values
    started = time.perf_counter()
    model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m studies.dtype_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--lengths", default="1,2,4,8,16,32,64")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "figures")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    base = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / f"{args.model}.yaml")
    models = {d: load_model(OmegaConf.merge(base, {"dtype": d, "allow_slow_bfloat16": True}), torch.device("cpu"))[0]
              for d in DTYPES}
    for model in models.values():
        forward_seconds(model, args.context, max(lengths))  # warm-up
    times = {(d, n): [] for d in DTYPES for n in lengths}
    for _ in range(args.repeats):
        for n in lengths:
            for d in DTYPES:
                times[d, n].append(forward_seconds(models[d], args.context, n))
    median = {key: statistics.median(values) for key, values in times.items()}
    machine = f"{device_name(torch.device('cpu'))}, {torch.get_num_threads()} threads, bfloat16 instructions: " \
              f"{', '.join(cpu_bfloat16_support()) or 'none'}"
    print(machine)
    print("L  " + "  ".join(f"{d}: t(L) ms  t(L)/t(1)" for d in DTYPES))
    rows = []
    for n in lengths:
        cells = [(median[d, n] * 1e3, median[d, n] / median[d, 1]) for d in DTYPES]
        rows.append([n, *[v for cell in cells for v in cell]])
        print(f"{n:<3}" + "  ".join(f"{ms:14.1f} {ratio:10.2f}" for ms, ratio in cells))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"dtype_profile-{args.model}-cpu{torch.get_num_threads()}t"
    header = "length," + ",".join(f"{d}_ms,{d}_ratio" for d in DTYPES)
    (args.out / f"{stem}.csv").write_text(header + "\n" + "\n".join(",".join(f"{v:.4g}" for v in r) for r in rows)
                                          + f"\n# {machine}; context {args.context}; median of {args.repeats}\n")
    figure, axes = plt.subplots(figsize=(6, 4))
    for index, d in enumerate(DTYPES):
        axes.plot(lengths, [r[2 + 2 * index] for r in rows], marker="o", label=d)
    axes.set(xscale="log", xlabel="L (tokens verified in one forward)", ylabel="t(L) / t(1)",
             title=f"{args.model}, context {args.context}")
    axes.set_xticks(lengths, [str(n) for n in lengths])
    axes.axhline(1, color="grey", linewidth=0.5)
    axes.legend(title=machine.split(",")[0][:40], fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out / f"{stem}.png", dpi=120)
    print(f"wrote {args.out / stem}.csv and .png")


if __name__ == "__main__":
    main()
