"""The Spec-Bench side of the recycling and samd parity files (bench/parity/methods/): runs Spec-Bench's own Token
Recycling and SAM-Decoding code from a checkout of hemingkx/Spec-Bench, in the second side venv (Spec-Bench's
transformers 4.37.1), never in the project's, and imports nothing of the project:

    <venv>/bin/python bench/parity/sides/spec_bench_driver.py JOB.json OUT.json

JOB.json as upstream_driver.py's, with "spec_bench" (the checkout) and each run with "warmup" (how many times both
turns of the first question are decoded before the counted prompts, as Spec-Bench's evaluation/eval.py does 3
times): Token Recycling
{"method": "recycling", "output_id_topk", "tree_version"}, SAM-Decoding {"method": "samd", "n_predicts",
"len_threshold", "len_bias", "tree_method": "token_recycle" | "eagle2", "head_dir" (eagle2)}.
OUT.json: per run name, per counted prompt {"tokens", "steps" (target forwards, the prefill included, until
max_new_tokens tokens or EOS were known), "accept_lengths" (Spec-Bench's, as its forward function returns them)}.

What runs is Spec-Bench's: `recycling_forward` of evaluation/inference_recycling.py over its module-level
`adj_matrix`, made once per run as its __main__ makes it (so warm-up and earlier prompts fill it), and
`SamdModel.generate` (model/samd) built as evaluation/inference_samd.py builds it, one object per run. The glue:
- evaluation/eval.py (the answer loop: fastchat's Vicuna template, CUDA timing) is not run; its loop is done here on
  our prompt ids. Imports of what is not run are stubbed: fastchat's str_to_torch_dtype (the runners' argument
  parsing) and model/samd/sam/utils.py (the static corpus's build/dump/load, unused without --static_sam_path; it
  imports datasets, whose version here needs a newer huggingface_hub than transformers 4.37 allows).
- CUDA: recycling_forward puts its tensors on `cuda:0`; its module's `torch.device(...)` is the CPU here and
  Tensor.cuda() returns the tensor (this process runs nothing else). SAMD takes its device as an argument: "cpu".
- SAMD's static KV cache reads `lm.hf_device_map`, set by from_pretrained(device_map=...) on GPU: {"": "cpu"}.
- SAMD's EAGLE-2 copy hard-codes RoPE base 10000 (SmolLM2's rope_theta is set) and drafts with the target's full LM
  head; ours uses an 8k slice, so its head is the full LM head plus -1e9 off the slice (upstream_driver.py).
"""
from __future__ import annotations

import json
import os
import sys
import types

import torch
from upstream_driver import (
    StubTokenizer,
    cut,
    forwards_until_done,
    run_job,
    running_sums,
    set_rope_base,
    sliced_head,
    spec_bench_order,
)


class CpuTorch(types.ModuleType):
    """A module's `torch` in which torch.device(...) (Spec-Bench's hard-coded 'cuda:0') is the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def device(*args, **kwargs) -> torch.device:
        return torch.device("cpu")


def import_spec_bench(root: str) -> None:
    """Put the checkout on the path, stub the imports of what is not run and make .cuda() a no-op."""
    sys.path.insert(0, root)
    fastchat = types.ModuleType("fastchat")
    fastchat.utils = types.SimpleNamespace(str_to_torch_dtype=None)
    sys.modules.update({"fastchat": fastchat, "fastchat.utils": fastchat.utils,
                        "model.samd.sam.utils": types.SimpleNamespace(build_sam=None, dump_sam=None, load_sam=None),
                        "evaluation.eval": types.SimpleNamespace(run_eval=None, reorg_answer_file=None)})
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


# --- Token Recycling (evaluation/inference_recycling.py) --------------------------------------------------------

def run_recycling(job: dict, run: dict) -> list[dict]:
    import evaluation.inference_recycling as runner

    runner.torch = CpuTorch("torch")
    model = runner.LlamaForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32).eval()
    runner.adj_matrix = torch.zeros((model.vocab_size, run["output_id_topk"]), dtype=torch.long)
    tokenizer = StubTokenizer(job["eos"])
    results = []
    for counted, prompt in spec_bench_order(job["prompts"], run["warmup"]):
        inputs = types.SimpleNamespace(input_ids=torch.tensor([prompt]))
        output_ids, _, _, accept_lengths = runner.recycling_forward(
            inputs, model, tokenizer, job["max_new_tokens"], output_id_topk=run["output_id_topk"],
            tree_version=run["tree_version"])
        new = output_ids[0, len(prompt):].tolist()
        if len(new) < job["max_new_tokens"] and job["eos"] not in new:
            new.append(job["eos"])  # its other exit: the next root is EOS, which output_ids leave out
        tokens = cut(new, job["eos"], job["max_new_tokens"])
        # step s verifies a tree rooted at the last known token (the prompt's last at first: the prefill leaves it
        # out) and makes accept_lengths[s] new tokens known, the next root included
        if counted:
            results.append({"tokens": tokens, "steps": forwards_until_done(running_sums(accept_lengths), tokens),
                            "accept_lengths": accept_lengths})
    return results


# --- SAM-Decoding (evaluation/inference_samd.py, model/samd) ---------------------------------------------------

def samd_model(job: dict, run: dict):
    """SamdModel as inference_samd.py's __main__ builds it (no static corpus: --static_sam_path unset)."""
    from model.samd import DraftModel, SamdConfig, SamdModel
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(job["model_dir"], torch_dtype=torch.float32,
                                              attn_implementation="sdpa").eval()
    lm.hf_device_map = {"": "cpu"}
    config = SamdConfig(n_predicts=run["n_predicts"], tree_method=run["tree_method"],
                        tree_model_path=run.get("head_dir"), len_threshold=run["len_threshold"],
                        len_bias=run["len_bias"], tree_path=None)
    draft = DraftModel(config, sam_static=None, lm=lm, dtype=torch.float32, device="cpu")
    if run["tree_method"] == "eagle2":
        set_rope_base(draft.tree_model.model, lm.config.rope_theta)
        draft.tree_model.head = sliced_head(lm.lm_head, torch.load(os.path.join(run["head_dir"],
                                                                                "draft_vocab_ids.pt")))
    return SamdModel(config, lm, draft, job["eos"], torch.float32, "cpu").eval()  # as eval.py's get_model_answers


def run_samd(job: dict, run: dict) -> list[dict]:
    from model.samd import SamdGenerationConfig

    model = samd_model(job, run)
    settings = SamdGenerationConfig(max_new_tokens=job["max_new_tokens"],
                                    max_cache_len=model.lm.config.max_position_embeddings, greedy=True)
    results = []
    for counted, prompt in spec_bench_order(job["prompts"], run["warmup"]):
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt]), generation_config=settings)
        tokens = cut(out.output_ids[0][len(prompt):], job["eos"], job["max_new_tokens"])
        # the prefill picks the first root; step s makes its root and accepted drafts (accept lengths) part of the
        # sequence and picks the next root
        if counted:
            known = running_sums(out.accepet_length_per_step, start=1)
            results.append({"tokens": tokens, "steps": forwards_until_done(known, tokens),
                            "accept_lengths": out.accepet_length_per_step})
    return results


RUNNERS = {"recycling": run_recycling, "samd": run_samd}


def main() -> None:
    job_path, out_path = sys.argv[1:3]
    import_spec_bench(json.loads(open(job_path).read())["spec_bench"])
    run_job(RUNNERS, job_path, out_path)


if __name__ == "__main__":
    main()
