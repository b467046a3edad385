"""The upstream side of the pard parity file (bench/parity/methods/pard.py): AMD's own inference loop,
`pard/pard_infer.py` (`PardInfer.generate`, `--para`, greedy), from an AMD-AGI/PARD checkout (its `pard` folder is
enough; measured at commit 6f279bf), run in the side environment $SPECBENCH_CACHE/pard-venv (this machine's torch;
transformers 4: upstream sets cache_position, which transformers 5 no longer reads), never in the project's; it
imports nothing of the project:

    <venv>/bin/python bench/parity/sides/pard_driver.py JOB.json OUT.json

It is CUDA-only as written; it runs unchanged but for what is swapped in from outside: `torch.cuda.synchronize` a
no-op, its models loaded by its own `model_init` on the CPU in float32 (eager attention, its StaticCache), `--nc` (no
torch.compile), its `get_input` handing it our prompt ids and a tokenizer whose `decode` records the ids it is given
(upstream decodes each answer once, at its end). Its per-step accepted counts are read from its own log lines.

JOB.json: {"pard_dir", "target_dir", "draft_dir", "ks", "prompts", "max_new_tokens", "eos"}; OUT.json: per K, per
prompt {"tokens", "steps" (accepted tokens per step)}.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


class RecordingTokenizer:
    """The tokenizer upstream's generate is handed: its eos id, and a decode that records the ids of each answer."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id, self.decoded = eos_token_id, []

    def decode(self, ids) -> str:
        self.decoded.append(ids.tolist())
        return ""


def upstream_outputs(job: dict, k: int) -> list[dict]:
    """{"tokens": new tokens, "steps": accepted tokens per step} of each prompt through upstream's
    PardInfer.generate with `k` drafts a step on the CPU (run in the side environment)."""
    import torch
    from transformers.utils import import_utils

    import_utils._kernels_available = False  # this machine's `kernels` package needs huggingface_hub 1.x
    sys.path.insert(0, job["pard_dir"])
    torch.cuda.synchronize = lambda *args, **kwargs: None
    from loguru import logger
    from pard import pard_infer

    steps: list[int] = []
    logger.remove()
    logger.add(lambda message: steps.append(int(message.record["message"].split(":")[1]))
               if message.record["message"].startswith("[accept token num]") else None)
    max_new_tokens, eos, prompts = job["max_new_tokens"], job["eos"], job["prompts"]
    length = max(len(p) for p in prompts) + max_new_tokens + 2 * k + 64  # its loop leaves 32 of max_cache_len free
    infer = pard_infer.PardInfer(k, max_new_tokens, job["draft_dir"], job["target_dir"], None, para=True, nc=True,
                                 max_cache_len=length, model_serie="specbench")
    target, target_cache = infer.model_init(job["target_dir"], torch.float32, length, device="cpu")
    draft, draft_cache = infer.model_init(job["draft_dir"], torch.float32, length, device="cpu")
    target.forward_gen, draft.forward_gen = target.forward, draft.forward
    infer.get_input = lambda ids, tokenizer, prompt_type: (None, torch.tensor([ids]))
    infer.log = False
    outputs = []
    for prompt in prompts:
        tokenizer, before = RecordingTokenizer(eos), len(steps)
        infer.generate([prompt], target, draft, target_cache, draft_cache, tokenizer)
        new = tokenizer.decoded[0][len(prompt):]
        cut = next((i + 1 for i, t in enumerate(new) if t == eos), len(new))
        outputs.append({"tokens": new[: min(cut, max_new_tokens)], "steps": steps[before:]})
    return outputs


def main() -> None:
    """The side environment's part: JOB.json's prompts through upstream's loop at each K, to OUT.json."""
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps({str(k): upstream_outputs(job, k) for k in job["ks"]}))


if __name__ == "__main__":
    main()
