"""DFlash beside the dflash package, the `dflash` rows of benchmarks/vs_upstream.py: our engine with our drafter and
dflash 0.1.0's `dflash_generate` (greedy, the drafter's block size) decode vs_upstream's prompt ids with the same
weights and target.

    OMP_NUM_THREADS=1 python -m benchmarks.vs_upstream --methods dflash

The checkpoint (the committed one, conf/method_model/dflash) is copied to a temporary folder in the published layout
upstream loads with DFlashDraftModel.from_pretrained (our `specbench_method` field and draft-vocabulary ids dropped),
so both sides draft over the whole vocabulary there (the first row); our drafter over the committed slice against
the same upstream run is the second. Upstream runs in the side environment $SPECBENCH_CACHE/dflash-venv (made on
first use: `dflash==0.1.0 --no-deps` over this machine's torch and transformers) as `python -m
benchmarks.dflash_parity JOB OUT`, which loads the target there as the project does. Besides each row: in how many
prompts every step accepted as many drafts on both sides, the share of steps accepting at least 1..4 drafts, and
whether the first drafted block after each prompt is equal (upstream's DFlashDraftModel forward over
extract_context_feature's features, as dflash_generate's first step calls it, against our `propose`).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from bench.config import compose_config
from bench.models import load_model
from benchmarks.upstream_driver import forwards_until_done, running_sums
from benchmarks.vs_upstream import (
    Comparison,
    Setup,
    acceptance_note,
    counted_output,
    decode_step_lengths,
    engine_outputs,
    side_outputs,
    side_venv,
)
from methods.dflash.checkpoints import published_copy
from methods.dflash.drafter import DFlashDrafter

DFLASH_PINS = ("dflash==0.1.0",)


def upstream_run(drafter, target, prompt: list[int], max_new_tokens: int, eos: list[int]) -> dict:
    """{"tokens": new tokens, "steps": tokens per decode step} of the dflash package's dflash_generate, greedy."""
    import dflash.model as upstream

    upstream._cuda_time = time.perf_counter  # its stats timer synchronises CUDA; the counts are what is compared
    out = upstream.dflash_generate(drafter, target, torch.tensor([prompt]), max_new_tokens, eos, temperature=0.0,
                                   return_stats=True)
    return {"tokens": out.output_ids[0, len(prompt):].tolist(), "steps": list(out.acceptance_lengths)}


@torch.inference_mode()
def upstream_first_block(drafter, target, prompt: list[int]) -> list[int]:
    """The first block upstream drafts after `prompt`: its DFlashDraftModel forward over extract_context_feature's
    features, as dflash_generate's first step calls it."""
    import dflash.model as upstream

    out = target(torch.tensor([prompt]), output_hidden_states=True)
    root, size = int(out.logits[0, -1].argmax()), drafter.block_size
    features = upstream.extract_context_feature(out.hidden_states, drafter.target_layer_ids)
    block = torch.tensor([[root] + [drafter.mask_token_id] * (size - 1)])
    hidden = drafter(target_hidden=features, noise_embedding=target.get_input_embeddings()(block),
                     position_ids=torch.arange(len(prompt) + size)[None])[:, 1:]
    return drafter.compute_logits(hidden, target.lm_head).argmax(-1)[0].tolist()


@torch.inference_mode()
def our_first_block(folder: Path, target, prompt: list[int]) -> list[int]:
    """The first block our DFlashDrafter proposes after `prompt` and the target's next token."""
    out = target(torch.tensor([prompt]), output_hidden_states=True)
    root = int(out.logits[0, -1].argmax())
    ours = DFlashDrafter(target, checkpoint=str(folder))
    ours.start(prompt, hidden=torch.cat([out.hidden_states[i][0] for i in ours.feature_layers], dim=-1))
    return list(ours.propose(prompt + [root], ours.block_size + 1).tokens)


def upstream_outputs(job: dict) -> list[dict]:
    """The side environment's part: each prompt through dflash_generate, with its first drafted block."""
    import dflash.model as upstream

    target, _ = load_model(compose_config("model=smollm2_135m", "model.dtype=float32").model, torch.device("cpu"))
    drafter = upstream.DFlashDraftModel.from_pretrained(job["draft_dir"], dtype=torch.float32).eval()
    return [{**upstream_run(drafter, target, prompt, job["max_new_tokens"], job["eos"]),
             "first_block": upstream_first_block(drafter, target, prompt)} for prompt in job["prompts"]]


def comparisons(setup: Setup, tmp: Path) -> list[Comparison]:
    """The `dflash` rows of vs_upstream: ours over the whole vocabulary and over the committed slice, each beside
    one upstream run on the published copy."""
    checkpoint = Path(compose_config("method=dflash", "model=smollm2_135m").method.drafter.checkpoint)
    copy = published_copy(checkpoint, tmp / "dflash-published")
    stop = setup.stop
    job = {"draft_dir": str(copy), "prompts": setup.prompts, "max_new_tokens": stop.max_new_tokens,
           "eos": sorted(stop.eos_token_ids)}
    theirs = side_outputs(side_venv("dflash-venv", DFLASH_PINS), ["-m", "benchmarks.dflash_parity"], job, tmp,
                          "dflash")
    their_counts = [(r["tokens"], forwards_until_done(running_sums(r["steps"], start=1), r["tokens"])) for r in theirs]
    blocks = sum(our_first_block(copy, setup.model, p) == r["first_block"] for p, r in zip(setup.prompts, theirs))
    block, rows = json.loads((copy / "config.json").read_text())["block_size"], []
    for label, folder in (("whole vocabulary (the published copy) on both sides", copy),
                          ("ours over the committed draft vocabulary, upstream's whole", checkpoint)):
        outs = engine_outputs(setup, lambda folder=folder: DFlashDrafter(setup.model, checkpoint=str(folder)))
        same = sum(decode_step_lengths(o) == r["steps"] for o, r in zip(outs, theirs))
        notes = [f"dflash, {label}: steps equal in {same}/{len(theirs)} prompts, first blocks equal {blocks}/"
                 f"{len(theirs)}",
                 acceptance_note(f"dflash, {label}", outs, [r["steps"] for r in theirs], 4, "upstream")]
        rows.append(Comparison("dflash", f"block {block}, {label}, vs dflash 0.1.0 dflash_generate",
                               [counted_output(o, stop.max_new_tokens) for o in outs], their_counts, notes))
    return rows


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(upstream_outputs(job)))


if __name__ == "__main__":
    main()
