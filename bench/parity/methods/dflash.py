"""DFlash beside the dflash package's `dflash_generate` (0.1.0, greedy, the drafter's block size;
sides/dflash_driver.py) with the same weights and target. The checkpoint (conf/method_model/dflash) is copied to a
temporary folder in the published layout upstream loads (our `specbench_method` field and draft-vocabulary ids
dropped), so both sides draft over the whole vocabulary there (the first row); our drafter over the committed slice
against the same upstream run is the second. The notes: in how many prompts every step accepted as many drafts on
both sides, the share of steps accepting at least 1..4 drafts, and whether the first drafted block after each prompt
is equal (upstream's DFlashDraftModel forward, as dflash_generate's first step calls it, against our `propose`)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.models import dequantized_gguf
from bench.parity.environments import SideEnvironment
from bench.parity.protocol import (
    Comparison,
    Setup,
    acceptance_note,
    counted_outputs,
    counted_steps,
    decode_step_lengths,
    engine_outputs,
)
from methods.dflash.checkpoints import published_copy
from methods.dflash.drafter import DFlashDrafter

AGAINST = "dflash 0.1.0"
DFLASH = SideEnvironment("dflash-venv", ("dflash==0.1.0",))


def comparisons(setup: Setup, work: Path) -> list[Comparison]:
    checkpoint = Path(setup.knobs("dflash")["checkpoint"])
    copy = published_copy(checkpoint, work / "published")
    job = {"target_dir": str(dequantized_gguf(setup.model_cfg)), "draft_dir": str(copy), "prompts": setup.prompts,
           "max_new_tokens": setup.stop.max_new_tokens, "eos": sorted(setup.stop.eos_token_ids)}
    theirs = DFLASH.run("dflash_driver", job, work)
    blocks = sum(our_first_block(copy, setup.model, p) == r["first_block"] for p, r in zip(setup.prompts, theirs))
    block, rows = json.loads((copy / "config.json").read_text())["block_size"], []
    for label, folder in (("whole vocabulary (the published copy) on both sides", copy),
                          ("ours over the committed draft vocabulary, upstream's whole", checkpoint)):
        outs = engine_outputs(setup, setup.drafter("dflash", checkpoint=str(folder), block_size=None))
        same = sum(decode_step_lengths(o) == r["steps"] for o, r in zip(outs, theirs))
        notes = [f"dflash, {label}: steps equal in {same}/{len(theirs)} prompts, first blocks equal {blocks}/"
                 f"{len(theirs)}",
                 acceptance_note(f"dflash, {label}", outs, [r["steps"] for r in theirs], 4, "upstream")]
        rows.append(Comparison("dflash", f"block {block}, {label}, vs dflash 0.1.0 dflash_generate",
                               counted_outputs(setup, outs), counted_steps(theirs), notes))
    return rows


@torch.inference_mode()
def our_first_block(folder: Path, target, prompt: list[int]) -> list[int]:
    """The first block our DFlashDrafter proposes after `prompt` and the target's next token."""
    out = target(torch.tensor([prompt]), output_hidden_states=True)
    root = int(out.logits[0, -1].argmax())
    ours = DFlashDrafter(target, checkpoint=str(folder))
    ours.start(prompt, hidden=torch.cat([out.hidden_states[i][0] for i in ours.feature_layers], dim=-1))
    return list(ours.propose(prompt + [root], ours.block_size + 1).tokens)
