"""Training throughput side by side: tokens/s of training steps in float32 and under bfloat16 autocast, per recipe.

    python -m studies.train_throughput [--model smollm2_135m] [--methods medusa,eagle,hydra,sps] [--steps 10]

Each method's step is the trainer's own (methods/heads/training.py train_step; methods/sps/train.py sps_step) with
its recipe and batch shape from conf/train/<method>.yaml, on the real target (its shapes, LM head, layers) and
synthetic features (random token ids, unit-variance features, every position trained): throughput does not depend
on the values. The two dtypes alternate step by step in one process, each on its own copy of the module and
optimizer, after `--warmup` untimed steps each; the table gives the median step's tokens/s. Run it on a quiet
machine (nothing else running): the numbers are meaningless under contention.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from bench.artifacts import PROJECT_ROOT
from bench.models import load_model
from methods.heads.common import DraftVocabulary
from methods.heads.features import Features
from methods.heads.training import train_step
from methods.sps.draft import own_state, slice_target
from methods.sps.train import sps_step

DTYPES = (torch.float32, torch.bfloat16)


def train_config(method: str, model: str):
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[f"method={method}", f"model={model}"])


def head_stepper(cfg, target):
    """(step(dtype) -> None, tokens per step, what) for a trained-head recipe on synthetic features."""
    tcfg, seq = cfg.train, cfg.features.seq_len
    recipe = instantiate(tcfg.recipe)
    lm_head = target.get_output_embeddings()
    size = tcfg.get("draft_vocab_size")
    vocab = DraftVocabulary(lm_head, torch.arange(size) if size else None)
    generator = torch.Generator().manual_seed(0)
    batch = Features(torch.randint(lm_head.weight.shape[0], (tcfg.batch_size, seq), generator=generator),
                     torch.randn(tcfg.batch_size, seq, lm_head.weight.shape[1], generator=generator),
                     torch.randint(vocab.size, (tcfg.batch_size, seq), generator=generator),
                     torch.ones(tcfg.batch_size, seq, dtype=torch.bool))
    module = recipe.build(target, tcfg)
    copies = {dtype: copy.deepcopy(module) for dtype in DTYPES}
    optimizers = {dtype: torch.optim.AdamW(m.parameters(), lr=1e-4) for dtype, m in copies.items()}

    def step(dtype):
        train_step(recipe, copies[dtype], vocab, batch, target, optimizers[dtype], 1e-4, tcfg.grad_clip, dtype)

    extra = f", ttt_steps={tcfg.ttt_steps}" if "ttt_steps" in tcfg else ""
    return step, tcfg.batch_size * seq, f"batch {tcfg.batch_size} x {seq}, vocab {vocab.size}{extra}"


def sps_stepper(cfg, target):
    """(step(dtype) -> None, tokens per step, what) for SpS's KL distillation on random token ids."""
    tcfg = cfg.train
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(target.config.vocab_size, (tcfg.batch_size, tcfg.seq_len), generator=generator)
    drafts = {dtype: slice_target(target, list(tcfg.layers)) for dtype in DTYPES}
    params = {dtype: list(own_state(d).values()) for dtype, d in drafts.items()}
    for group in params.values():
        for p in group:
            p.requires_grad_(True)
    optimizers = {dtype: torch.optim.AdamW(params[dtype], lr=1e-4) for dtype in DTYPES}
    for draft in drafts.values():
        draft.train()

    def step(dtype):
        sps_step(target, drafts[dtype], batch, optimizers[dtype], params[dtype], 1e-4, dtype)

    return step, tcfg.batch_size * tcfg.seq_len, f"batch {tcfg.batch_size} x {tcfg.seq_len}, layers {list(tcfg.layers)}"


def measure(step, steps: int, warmup: int) -> dict[torch.dtype, float]:
    """Median seconds per step of each dtype, the dtypes alternating step by step."""
    times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in DTYPES}
    for i in range(warmup + steps):
        for dtype in DTYPES:
            start = time.perf_counter()
            step(dtype)
            if i >= warmup:
                times[dtype].append(time.perf_counter() - start)
    return {dtype: statistics.median(t) for dtype, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m studies.train_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="a conf/model/<name>.yaml")
    parser.add_argument("--methods", default="medusa,eagle,hydra,sps")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per dtype")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per dtype first")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    target = None
    for method in args.methods.split(","):
        cfg = train_config(method, args.model)
        if target is None:
            cfg.model.dtype = "float32"
            target, _ = load_model(cfg.model, torch.device("cpu"))
            target.requires_grad_(False)
        step, tokens, what = (sps_stepper if method == "sps" else head_stepper)(cfg, target)
        seconds = measure(step, args.steps, args.warmup)
        rows.append((method, what, tokens / seconds[torch.float32], tokens / seconds[torch.bfloat16]))
        print(f"{method}: done", file=sys.stderr)
    print(f"training tokens/s, median of {args.steps} steps per dtype (alternating, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()})")
    print("| method | step | float32 tok/s | bfloat16 autocast tok/s | ratio |\n| --- | --- | --- | --- | --- |")
    for method, what, fp32, bf16 in rows:
        print(f"| {method} | {what} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f}x |")


if __name__ == "__main__":
    main()
