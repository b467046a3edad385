"""The upstream sides of the mlp_speculator parity file (bench/parity/methods/mlp_speculator.py), run in their own
environments, never in the project's; it imports nothing of the project:

    <python> bench/parity/sides/mlp_speculator_driver.py JOB.json OUT.json

JOB.json: {"side": "vllm" | "fms-extras", "speculator_dir" (our stages in IBM's layout), "target_dir" (the dequantized
model folder), "fms_extras" (a checkout), "prompts", "eos", "max_new_tokens", "n_predict", "top_k_tokens_per_head",
"n_candidates"}; OUT.json: {"first_hidden": the target's last hidden state of the first prompt (to check that both
sides run the same target), "runs": per prompt {"tokens", "steps" (tokens per decode step), "drafts" ({new tokens
known: the sequences drafted there})}}.

vLLM (the vLLM CPU build's environment, tools/build_vllm_cpu.sh): 0.32's V1 runner has no MLPSpeculator proposer
("Unknown speculative decoding method") and its model module lost `generate_proposals` with the V0 engine, so this
side builds vLLM's `MLPSpeculator` (its config class, norm, embeddings, projections, LM heads, `load_weights`, logits
processor) on the converted folder and drives its stages as V0's `generate_proposals` did (vLLM at commit 0531c22):
stage i adds emb_weight / state_weight times the embedding of the previous token to proj_i of the state, then ln_i
and GELU; the greedy sampler takes the argmax of the stage's logits; the state starts from the target's last hidden
state at the last accepted position and the token it produced (V0's spec_decode_worker). Its target is transformers'
Llama on the same dequantized folder, one cached forward per step over the last token and the drafts, verified by the
rule of vLLM's `rejection_greedy_sample_kernel` (drafts kept while they equal the target's argmax, then the target's
token; the bonus token when all were kept; its Triton kernel does not run on this CPU). As our engine, it drafts at
most as many tokens as the answer has left, less one.

fms-extras (a checkout of foundation-model-stack/fms-extras, run in the fms environment with ibm-fms 0.0.5): its
MLPSpeculator loaded strictly, `generate_suffixes` after the last token from the target's last hidden state, every
candidate verified whole by the target (one batch over the recomputed context: speculative_generate's paged cache
needs its CUDA extension, stubbed here and never called) and the best one kept by speculative_generate's own
`__get_best_candidates` and `__get_correct_tokens`. As upstream, it always drafts n_predict tokens.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path


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


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(upstream_outputs(job)))


if __name__ == "__main__":
    main()
