"""PARD beside AMD's own inference loop: our engine with method=pard and upstream's `pard/pard_infer.py`
(`PardInfer.generate`, `--para`, greedy) decode the same prompt ids with the same target and PARD draft, on this
CPU; prints both #MAT (tokens per target forward, the prefill included), per-position acceptance and whether the
tokens are equal.

    python -m venv --system-site-packages ~/.cache/specbench/pard-venv   # once; this machine's torch
    ~/.cache/specbench/pard-venv/bin/pip install --no-deps loguru==0.7.3 click transformers==4.53.3 \\
        tokenizers==0.21.4 huggingface-hub==0.36.2   # what pard_infer.py needs (it sets cache_position, which
                                                     # transformers 5 no longer reads)
    git -C <AMD-AGI/PARD checkout> archive HEAD pard | tar -x -C ~/.cache/specbench/upstream/PARD
    python -m benchmarks.pard_driver [--draft artifacts/pard/smollm2_135m] [--k 8] [--questions 81,82]
        [--max-new-tokens 64] [--pard <checkout>] [--python <the side environment's python>]

Upstream's loop (run in the side environment by this file's `--upstream` mode) is CUDA-only as written; it runs
unchanged but for what is swapped in from outside: `torch.cuda.synchronize` a no-op, its models loaded by its own
`model_init` on the CPU in float32 (eager attention, its StaticCache), `--nc` (no torch.compile), its `get_input`
handing it our prompt ids (our chat template; MT-bench, turn 2 after vanilla's turn-1 answer, as
benchmarks/vs_upstream.py builds them) and a tokenizer whose `decode` records the ids it is given (upstream decodes
each answer once, at its end). Its per-step accepted counts are read from its own log lines. Both sides load the
same folders: the dequantized target (vs_upstream.side_model_dir) and our draft written out with the target's
embedding (methods/sps/draft.standalone_draft; config in transformers 4's spelling). Two differences in the loops,
not in drafting: upstream drafts already at its prefill (its first target forward verifies K drafts; ours gives the
first token alone), and it decodes past max_new_tokens by up to K tokens (tokens are compared up to
max_new_tokens, forwards counted until they were known).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


class RecordingTokenizer:
    """The tokenizer upstream's generate is handed: its eos id, and a decode that records the ids of each answer."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id, self.decoded = eos_token_id, []

    def decode(self, ids) -> str:
        self.decoded.append(ids.tolist())
        return ""


def upstream_outputs(job: dict) -> list[dict]:
    """{"tokens": new tokens, "steps": accepted tokens per step} of each prompt through upstream's
    PardInfer.generate on the CPU (run in the side environment)."""
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
    k, max_new_tokens, eos, prompts = job["k"], job["max_new_tokens"], job["eos"], job["prompts"]
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


def position_acceptance(step_lengths: list[list[int]], k: int) -> list[float]:
    """Per draft position i (1..k): the share of steps that accepted at least i drafts."""
    steps = [n - 1 for lengths in step_lengths for n in lengths]
    return [sum(n >= i for n in steps) / max(len(steps), 1) for i in range(1, k + 1)]


def compare(args: argparse.Namespace) -> None:
    """Our side here, upstream's in the side environment, then the table."""
    import torch
    from omegaconf import OmegaConf

    from bench.artifacts import PROJECT_ROOT
    from bench.engine.loop import SpeculativeEngine, StopCondition
    from bench.models import eos_token_ids, load_model
    from benchmarks.upstream_driver import forwards_until_done, running_sums
    from benchmarks.vs_upstream import decode_step_lengths, divergence, mt_bench_prompts, side_model_dir
    from methods.pard.drafter import ParallelDraftDrafter
    from methods.sps.draft import standalone_draft

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml")
    model, tokenizer = load_model(cfg, torch.device("cpu"))
    eos = sorted(eos_token_ids(model, tokenizer))
    prompts = mt_bench_prompts(model, tokenizer, [int(q) for q in args.questions.split(",")], args.max_new_tokens,
                               eos)
    stop = StopCondition(args.max_new_tokens, frozenset(eos))
    ours = [SpeculativeEngine(model, ParallelDraftDrafter(model, draft_path=args.draft, num_draft_tokens=args.k))
            .generate(p, stop) for p in prompts]
    our_steps = [decode_step_lengths(out) for out in ours]
    our_forwards = [forwards_until_done(running_sums(lengths, start=1), out.tokens)
                    for lengths, out in zip(our_steps, ours)]
    target_dir = side_model_dir(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        draft_dir = transformers4_copy(standalone_draft(args.draft, target_dir), Path(tmp) / "draft")
        job = {"pard_dir": str(Path(args.pard).expanduser()), "target_dir": str(target_dir),
               "draft_dir": str(draft_dir), "k": args.k, "max_new_tokens": args.max_new_tokens, "eos": eos[0],
               "prompts": prompts}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        subprocess.run([str(Path(args.python).expanduser()), __file__, "--upstream", str(Path(tmp) / "job.json")],
                       check=True)
        theirs = json.loads((Path(tmp) / "job.json.out").read_text())
    # upstream's first step is its prefill: no forward before it
    their_forwards = [forwards_until_done(running_sums(r["steps"]), r["tokens"]) - 1 for r in theirs]
    our_mat = sum(len(out.tokens) for out in ours) / sum(our_forwards)
    their_mat = sum(len(r["tokens"]) for r in theirs) / sum(their_forwards)
    print(f"{len(prompts)} prompts (MT-bench {args.questions}, both turns), {args.max_new_tokens} new tokens, greedy, "
          f"float32, SmolLM2-135M, draft {args.draft}, K = {args.k}")
    print("| side | #MAT | steps accepting >= 1 / 2 / 3 / 4 drafts | tokens equal |")
    print("| --- | --- | --- | --- |")
    equal = divergence([out.tokens for out in ours], [r["tokens"] for r in theirs])
    for name, mat, lengths in (("ours", our_mat, our_steps),
                               ("pard_infer.py", their_mat, [r["steps"] for r in theirs])):
        shares = " / ".join(f"{share:.3f}" for share in position_acceptance(lengths, args.k)[:4])
        print(f"| {name} | {mat:.3f} | {shares} | {equal} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default="artifacts/pard/smollm2_135m")
    parser.add_argument("--k", type=int, default=8, help="draft tokens per step (upstream's draft_k)")
    parser.add_argument("--questions", default="81,82", help="question ids (MT-bench: 81-160)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--pard", default="~/.cache/specbench/upstream/PARD", help="an AMD-AGI/PARD checkout")
    parser.add_argument("--python", default="~/.cache/specbench/pard-venv/bin/python", help="the side environment")
    parser.add_argument("--upstream", default=None, help=argparse.SUPPRESS)  # the side environment's job file
    args = parser.parse_args()
    if args.upstream:
        job = json.loads(Path(args.upstream).read_text())
        Path(args.upstream + ".out").write_text(json.dumps(upstream_outputs(job)))
    else:
        compare(args)


if __name__ == "__main__":
    main()
