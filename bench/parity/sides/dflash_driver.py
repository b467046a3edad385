"""The upstream side of the dflash parity file (bench/parity/methods/dflash.py): the dflash package's (0.1.0)
`dflash_generate`, greedy, at the drafter's block size, run in the side environment $SPECBENCH_CACHE/dflash-venv
(`dflash==0.1.0 --no-deps` over this machine's torch and transformers), never in the project's; it imports nothing
of the project:

    <venv>/bin/python bench/parity/sides/dflash_driver.py JOB.json OUT.json

The target is loaded from the project's float32 model folder (`target_dir`: the dequantized GGUF, as the project
loads it); the drafter from the published copy of our checkpoint (`draft_dir`, DFlashDraftModel.from_pretrained).
JOB.json: {"target_dir", "draft_dir", "prompts", "max_new_tokens", "eos"}; OUT.json: per prompt {"tokens", "steps"
(tokens per decode step), "first_block" (the first block drafted after the prompt: DFlashDraftModel's forward over
extract_context_feature's features, as dflash_generate's first step calls it)}.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


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


def upstream_outputs(job: dict) -> list[dict]:
    """Each prompt through dflash_generate, with its first drafted block."""
    import dflash.model as upstream
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(job["target_dir"], dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
    drafter = upstream.DFlashDraftModel.from_pretrained(job["draft_dir"], dtype=torch.float32).eval()
    return [{**upstream_run(drafter, target, prompt, job["max_new_tokens"], job["eos"]),
             "first_block": upstream_first_block(drafter, target, prompt)} for prompt in job["prompts"]]


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(upstream_outputs(job)))


if __name__ == "__main__":
    main()
