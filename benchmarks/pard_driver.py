"""PARD beside AMD's own inference loop, the `pard` rows of benchmarks/vs_upstream.py: our engine with method=pard and
upstream's `pard/pard_infer.py` (`PardInfer.generate`, `--para`, greedy) decode vs_upstream's prompt ids with the
same target and PARD draft, at K = 2 (ours on this CPU, conf/method_model/pard) and 12 (upstream's draft_k default);
besides the row, the share of steps accepting at least 1..3 drafts on each side.

    OMP_NUM_THREADS=1 python -m benchmarks.vs_upstream --methods pard

needs an AMD-AGI/PARD checkout (its `pard` folder is enough) in $SPECBENCH_CACHE/upstream/PARD (measured at commit
6f279bf). Upstream's loop runs in the side
environment $SPECBENCH_CACHE/pard-venv (made on first use with PARD_PINS; this machine's torch; transformers 4:
upstream sets cache_position, which transformers 5 no longer reads) as `python -m benchmarks.pard_driver JOB OUT`,
so this module imports the project only inside `comparisons`. It is CUDA-only as written; it runs unchanged but for
what is swapped in from outside: `torch.cuda.synchronize` a no-op, its models loaded by its own `model_init` on the
CPU in float32 (eager attention, its StaticCache), `--nc` (no torch.compile), its `get_input` handing it our prompt
ids and a tokenizer whose `decode` records the ids it is given (upstream decodes each answer once, at its end). Its
per-step accepted counts are read from its own log lines. Both sides load the same folders: the dequantized target
(vs_upstream.side_model_dir) and our draft written out with the target's embedding
(methods/sps/draft.standalone_draft; config in transformers 4's spelling). Two differences in the loops, not in
drafting: upstream drafts already at its prefill (its first target forward verifies K drafts; ours gives the first
token alone), and it decodes past max_new_tokens by up to K tokens (tokens are compared up to max_new_tokens,
forwards counted until they were known).
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


def transformers4_copy(folder: Path, out: Path) -> Path:
    """`folder` (a standalone draft) with its config in transformers 4's spelling (rope_theta at top level), the
    weights linked."""
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters", None) or {}
    config.update(rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)), rope_scaling=None,
                  torch_dtype="float32")
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.pop("dtype", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for file in folder.iterdir():
        if file.name != "config.json" and not (out / file.name).exists():
            (out / file.name).symlink_to(file.resolve())
    return out


PARD_PINS = ("loguru==0.7.3", "transformers==4.53.3", "tokenizers==0.21.4", "huggingface-hub==0.36.2")
PARD_GET = "git clone https://github.com/AMD-AGI/PARD {dir}"
KS = (2, 12)  # ours on this CPU; upstream's draft_k default


def comparisons(setup, tmp: Path) -> list:
    """The `pard` rows of vs_upstream: per K, our engine and upstream's loop (in its side environment)."""
    from bench.artifacts import cache_dir
    from bench.config import compose_config
    from benchmarks.upstream_driver import forwards_until_done, running_sums
    from benchmarks.vs_upstream import (
        Comparison,
        acceptance_note,
        counted_output,
        engine_outputs,
        required_checkout,
        side_model_dir,
        side_outputs,
        side_venv,
    )
    from methods.pard.drafter import ParallelDraftDrafter
    from methods.sps.draft import standalone_draft

    checkout = required_checkout(cache_dir() / "upstream" / "PARD", "pard/pard_infer.py", PARD_GET)
    draft = compose_config("method=pard", "model=smollm2_135m").method.drafter.draft_path
    target_dir = side_model_dir(setup.model_cfg)
    stop = setup.stop
    job = {"pard_dir": str(checkout), "target_dir": str(target_dir), "ks": list(KS), "prompts": setup.prompts,
           "draft_dir": str(transformers4_copy(standalone_draft(draft, target_dir), tmp / "pard-draft")),
           "max_new_tokens": stop.max_new_tokens, "eos": min(stop.eos_token_ids)}
    upstream = side_outputs(side_venv("pard-venv", PARD_PINS), ["-m", "benchmarks.pard_driver"], job, tmp, "pard")
    rows = []
    for k in KS:
        outs = engine_outputs(setup, lambda k=k: ParallelDraftDrafter(setup.model, draft_path=draft,
                                                                      num_draft_tokens=k))
        theirs = upstream[str(k)]
        # upstream's first step is its prefill: no forward before it
        their_counts = [(r["tokens"], forwards_until_done(running_sums(r["steps"]), r["tokens"]) - 1) for r in theirs]
        note = acceptance_note(f"pard K={k}", outs, [r["steps"] for r in theirs], 3, "pard_infer.py")
        rows.append(Comparison("pard", f"K={k}, {draft} vs AMD-AGI/PARD pard_infer.py --para --nc",
                               [counted_output(o, stop.max_new_tokens) for o in outs], their_counts, [note]))
    return rows


def main() -> None:
    """The side environment's part: JOB.json's prompts through upstream's loop at each K, to OUT.json."""
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps({str(k): upstream_outputs(job, k) for k in job["ks"]}))


if __name__ == "__main__":
    main()
