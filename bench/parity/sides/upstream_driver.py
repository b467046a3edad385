"""The upstream side of the lookahead, medusa and eagle parity files (bench/parity/methods/): runs in the side
virtual environment (transformers 4.34.1 with lade 0.0.2, medusa-llm 0.1, eagle-llm 1.2.1), never in the project's,
and imports nothing of the project. Our own glue around the installed packages (the helpers before the runners are
shared with the other drivers here, and with the project side):

    <venv>/bin/python bench/parity/sides/upstream_driver.py JOB.json OUT.json

JOB.json: {"model_dir", "eos", "max_new_tokens", "prompts": [[ids]], "runs": [{"name", "method", ...settings}]};
OUT.json: per run name, per prompt {"tokens", "steps"} (target forwards, the prefill included, until
max_new_tokens tokens or EOS).

What the glue changes, each only to run the packages on SmolLM2 with our heads, never their algorithms:
- RoPE: medusa's and eagle's Llama copies hard-code base 10000; SmolLM2's rope_theta (100000) is set instead.
- Medusa 0.1's KV cache has num_attention_heads slots; SmolLM2 has grouped KV heads (3 of 9), so it is allocated
  with num_key_value_heads slots (same KVCache class).
- Our heads project onto an 8k slice of the target's LM head. Medusa: each head's projection is the full LM head
  plus a bias of 0 on the slice and -1e9 elsewhere (medusa's own Linear is bias-free), so slice logits are ours and
  the rest never ranks. EAGLE: its draft calls `topK_genrate(..., head=lm_head)`; the driver passes a head of the
  same kind instead (full LM head + that bias). Greedy: top-k over these logits is top-k over the slice.
- Medusa 0.1 takes candidates from every head it has, so it gets the first len(medusa_choices) - 1 of ours.
- The tokenizer (only used for EOS and streaming text) is a stub that knows the EOS id and records the tokens.
"""
from __future__ import annotations

import json
import os
import sys
import types

import torch
from torch import nn


class StubTokenizer:
    """Stands in for AutoTokenizer.from_pretrained(...): eos_token_id, and decode() that records the ids."""

    def __init__(self, eos: int):
        self.eos_token_id = eos
        self.last: list[int] = []

    def decode(self, ids, **kwargs) -> str:
        self.last = [int(t) for t in ids]
        return ""


def stub_auto_tokenizer(eos: int):
    tokenizer = StubTokenizer(eos)
    return tokenizer, types.SimpleNamespace(from_pretrained=lambda *a, **k: tokenizer)


def set_rope_base(model: nn.Module, theta: float) -> None:
    """Rebuild every attention's rotary embedding (upstream's class) with base `theta`."""
    for module in model.modules():
        rotary = getattr(module, "rotary_emb", None)
        if rotary is not None and hasattr(rotary, "inv_freq"):
            device = rotary.inv_freq.device
            module.rotary_emb = type(rotary)(rotary.dim, max_position_embeddings=rotary.max_position_embeddings,
                                             base=theta, device=device)


def sliced_head(lm_head: nn.Linear, slice_ids: torch.Tensor) -> nn.Linear:
    """Full-vocabulary projection equal to `lm_head` on `slice_ids`, -1e9 (bias) elsewhere."""
    head = nn.Linear(lm_head.in_features, lm_head.out_features, bias=True).to(lm_head.weight.dtype)
    head.weight.data.copy_(lm_head.weight.data)
    head.bias.data.fill_(-1e9)
    head.bias.data[slice_ids] = 0.0
    return head


def cut(tokens: list[int], eos: int, limit: int) -> list[int]:
    tokens = tokens[:limit]
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def forwards_until_done(known_after_step: list[int], tokens: list[int]) -> int:
    """Target forwards (the prefill, then one per step) until all of `tokens` (already cut at max_new_tokens or
    EOS) were known; known_after_step[s]: how many new tokens were known after decode step s."""
    return 1 + next((s + 1 for s, known in enumerate(known_after_step) if known >= len(tokens)),
                    len(known_after_step))


def running_sums(values: list[int], start: int = 0) -> list[int]:
    sums, total = [], start
    for value in values:
        total += value
        sums.append(total)
    return sums


def spec_bench_order(prompts: list[list[int]], warmup: int) -> list[tuple[bool, list[int]]]:
    """(counted, prompt) in the order Spec-Bench's evaluation/eval.py decodes them: `warmup` times both turns of the
    first question (prompts[:2]), uncounted, then every prompt."""
    return [(False, p) for _ in range(warmup) for p in prompts[:2]] + [(True, p) for p in prompts]


# --- lookahead (lade) -------------------------------------------------------------------------------------------

def run_lade(job: dict, run: dict) -> list[dict]:
    import lade
    from transformers import LlamaForCausalLM

    if not getattr(lade, "_augmented", False):  # twice would make lade's proxy call itself
        lade.augment_all()
        lade._augmented = True
    lade.config_lade(LEVEL=run["ngram_size"], WINDOW_SIZE=run["window_size"], GUESS_SET_SIZE=run["guess_set_size"],
                     ALWAYS_FWD_ONE=run["always_fwd_one"], DEBUG=0)
    os.environ["USE_LADE"] = "1"
    model = LlamaForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    calls = [0]
    forward = model.jforward_multilevel

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    model.jforward_multilevel = counted
    results = []
    for prompt in job["prompts"]:
        calls[0] = 0
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=job["max_new_tokens"],
                                 do_sample=False, eos_token_id=job["eos"], pad_token_id=job["eos"])
        results.append({"tokens": cut(out[0, len(prompt):].tolist(), job["eos"], job["max_new_tokens"]),
                        "steps": calls[0]})
    return results


# --- medusa (medusa-llm 0.1) ------------------------------------------------------------------------------------

def run_medusa(job: dict, run: dict) -> list[dict]:
    import medusa.model.medusa_model as medusa_model
    from medusa.model.kv_cache import KVCache

    tokenizer, medusa_model.AutoTokenizer = stub_auto_tokenizer(job["eos"])

    def grouped_kv_cache(model):
        config = model.config
        data = torch.zeros(config.num_hidden_layers * 2, 1, config.num_key_value_heads,
                           config.max_position_embeddings, config.hidden_size // config.num_attention_heads,
                           device=model.device, dtype=model.dtype)
        lengths = torch.zeros(config.num_hidden_layers * 2, dtype=torch.long, device="cpu")
        caches = [[KVCache(data[i * 2 + j], lengths[i * 2 + j]) for j in range(2)]
                  for i in range(config.num_hidden_layers)]
        return caches, data, lengths

    medusa_model.initialize_past_key_values = grouped_kv_cache
    heads = run["heads_dir"]
    config = json.load(open(os.path.join(heads, "config.json")))
    base = medusa_model.KVLlamaForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    set_rope_base(base, base.config.rope_theta)
    used = len(run["medusa_choices"]) - 1  # medusa 0.1 draws candidates from every head it has: one per tree level
    model = medusa_model.MedusaModel(base, used, config["medusa_num_layers"], job["model_dir"])
    slice_ids = torch.load(os.path.join(heads, "draft_vocab_ids.pt"))
    for head in model.medusa_head:
        head[-1] = sliced_head(base.lm_head, slice_ids)
    state = torch.load(os.path.join(heads, "medusa_lm_head.pt"))
    model.medusa_head.load_state_dict({k: v for k, v in state.items() if int(k.split(".")[0]) < used}, strict=True)
    results = []
    for prompt in job["prompts"]:
        accepted = []  # per step: the tokens so far; the next root (picked from that step's logits) comes next step
        for _ in model.medusa_generate(torch.tensor([prompt]), temperature=0.0, max_steps=2 * job["max_new_tokens"],
                                       medusa_choices=run["medusa_choices"]):
            accepted.append(tokenizer.last)
            if len(accepted[-1]) >= job["max_new_tokens"] or job["eos"] in accepted[-1]:
                break
        results.append(first_forwards_to_finish(accepted, job))
    return results


def first_forwards_to_finish(accepted: list[list[int]], job: dict) -> dict:
    """Tokens and forwards (the prefill, then one per step) until max_new_tokens tokens or EOS were known, where
    after step s the known tokens are those accepted plus the next root, which step s's logits already picked."""
    for s, tokens in enumerate(accepted):
        known = accepted[s + 1][: len(tokens) + 1] if s + 1 < len(accepted) else tokens
        if len(known) >= job["max_new_tokens"] or job["eos"] in known:
            return {"tokens": cut(known, job["eos"], job["max_new_tokens"]), "steps": s + 2}
    return {"tokens": cut(accepted[-1], job["eos"], job["max_new_tokens"]), "steps": len(accepted) + 1}


# --- EAGLE-1 (eagle-llm 1.2.1) ----------------------------------------------------------------------------------

def run_eagle(job: dict, run: dict) -> list[dict]:
    # ea_model imports its Mixtral copy, which needs transformers >= 4.36 (MixtralConfig); lade needs 4.34.
    sys.modules.setdefault("eagle.model.modeling_mixtral_kv",
                           types.SimpleNamespace(MixtralForCausalLM=None, __name__="eagle.model.modeling_mixtral_kv"))
    import eagle.model.ea_model as ea_model

    tokenizer, ea_model.AutoTokenizer = stub_auto_tokenizer(job["eos"])
    model = ea_model.EaModel.from_pretrained(base_model_path=job["model_dir"], ea_model_path=run["head_dir"],
                                             torch_dtype=torch.float32).eval()
    set_rope_base(model, model.base_model.config.rope_theta)
    head = sliced_head(model.base_model.lm_head, torch.load(os.path.join(run["head_dir"], "draft_vocab_ids.pt")))
    draft = model.ea_layer.topK_genrate

    def draft_on_slice(hidden_states, input_ids, _lm_head=None, logits_processor=None, **kwargs):
        kwargs.pop("head", None)
        return draft(hidden_states, input_ids, head, logits_processor, **kwargs)

    model.ea_layer.topK_genrate = draft_on_slice
    trace: list[list[int]] = []
    update = ea_model.update_inference_inputs

    def recorded(*args, **kwargs):
        out = update(*args, **kwargs)
        input_ids, _, _, _, root = out
        trace.append(input_ids[0].tolist() + [int(root)])  # accepted so far, then the next root (already decided)
        return out

    ea_model.update_inference_inputs = recorded
    results = []
    for prompt in job["prompts"]:
        trace.clear()
        with torch.inference_mode():
            model.eagenerate(torch.tensor([prompt]), temperature=0.0, max_new_tokens=job["max_new_tokens"],
                             tree_choices=run["tree_choices"])
        # forwards until max_new_tokens tokens (or EOS) are known: the prefill, then one per step
        steps = next((i + 2 for i, ids in enumerate(trace)
                      if len(ids) - len(prompt) >= job["max_new_tokens"] or job["eos"] in ids[len(prompt):]),
                     len(trace) + 1)
        results.append({"tokens": cut(trace[steps - 2][len(prompt):], job["eos"], job["max_new_tokens"]),
                        "steps": steps})
    return results


RUNNERS = {"lookahead": run_lade, "medusa": run_medusa, "eagle": run_eagle}


def run_job(runners: dict, job_path: str, out_path: str) -> None:
    """Every run of the job file by its method's runner; the results to out_path."""
    job = json.load(open(job_path))
    torch.manual_seed(0)
    out = {run["name"]: runners[run["method"]](job, run) for run in job["runs"]}
    json.dump(out, open(out_path, "w"))


def main() -> None:
    run_job(RUNNERS, *sys.argv[1:3])


if __name__ == "__main__":
    main()
