"""The upstream side of the redrafter parity file (bench/parity/methods/redrafter.py): apple/ml-recurrent-drafter's
PyTorch code, from a checkout (its `recurrent_drafting` package is enough; measured at bd8586b), run in the side
environment $SPECBENCH_CACHE/redrafter-upstream/venv (this machine's torch and transformers plus what the package
imports), never in the project's; it imports nothing of the project:

    <venv>/bin/python bench/parity/sides/redrafter_driver.py JOB.json OUT.json

The target is the dequantized model folder loaded by upstream's own Llama (`recurrent_drafting.modeling_llama`), the
drafter our checkpoint rewritten in upstream's layout (methods/redrafter/checkpoints.py) and built as upstream's
Drafter, run by `RecurrentDrafting.generate` with greedy_search=True; it stops at the tokenizer's one EOS. OUT.json:
{"hidden": the last hidden state of upstream's prefill of the first prompt, "runs": {"WxL": per prompt {"tokens",
"forwards", "drafted" ({new tokens known: the beams drafted there})}}}.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from upstream_driver import cut, forwards_until_done

# upstream masks its pad id out of the attention; SmolLM2's prompts hold every special token (EOS ends each turn), so
# the pad is an id no prompt has (batch 1: upstream never writes it)
NO_PAD = -1


def upstream_models(upstream: Path, model_dir: Path, drafter_dir: Path, theta: float):
    """(RecurrentDrafting, its package) over upstream's Llama on `model_dir` and its Drafter from `drafter_dir`."""
    sys.path.insert(0, str(upstream))
    import recurrent_drafting
    import transformers

    llama = recurrent_drafting.modeling_llama.LlamaForCausalLM
    llama._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # transformers 5 wants a mapping
    config = transformers.LlamaConfig.from_pretrained(model_dir)
    config.rope_theta = theta  # upstream's Llama reads config.rope_theta (transformers 5 keeps rope_parameters)
    llm = llama.from_pretrained(model_dir, config=config, dtype=torch.float32)
    for layer in llm.model.layers:  # its rotary tables are made in __init__, which transformers 5 runs on "meta"
        rotary = layer.self_attn.rotary_emb
        rotary.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary.dim, 2).float() / rotary.dim))
        rotary._set_cos_sin_cache(rotary.max_position_embeddings, torch.device("cpu"), torch.float32)
    # upstream's Drafter skips post_init, which transformers 5's from_pretrained needs: built and loaded strictly here
    config = json.loads((drafter_dir / "config.json").read_text())
    fields = ("vocab_size", "hidden_size", "exit_dim", "num_draft_layers", "num_lookback_tokens", "rnn")
    drafter = recurrent_drafting.modeling_drafter.Drafter(
        recurrent_drafting.configuration_drafter.DrafterConfig(**{k: config[k] for k in fields}))
    drafter.load_state_dict(load_file(drafter_dir / "model.safetensors"), strict=True)
    return recurrent_drafting.recurrent_drafting.RecurrentDrafting(llm=llm, drafter=drafter).eval(), recurrent_drafting


def upstream_run(model, package, prompt: list[int], width: int, length: int, eos: int,
                 max_new_tokens: int) -> tuple[list[int], int, dict[int, list]]:
    """(tokens cut at max_new_tokens or EOS, target forwards until they were known, {new tokens known: the beams
    drafted there}) of upstream's greedy loop."""
    beam = package.modeling_drafter.BeamShape(width, length)
    args = package.recurrent_drafting.SamplingArgs(1.0, True)
    special = package.recurrent_drafting.SpecialTokens(NO_PAD, eos)
    known, output, drafted = [], None, []
    search = model.drafter.beam_search_candidates

    def recording(*args, **kwargs):
        beams, log_probs = search(*args, **kwargs)
        drafted.append(beams[0].tolist())
        return beams, log_probs

    model.drafter.beam_search_candidates = recording
    try:
        for output in model.generate(package.stats.Ledger(), torch.tensor([prompt]),
                                     len(prompt) + max_new_tokens, beam, args, special):
            known.append(output.shape[1] - len(prompt))
    finally:
        del model.drafter.beam_search_candidates
    tokens = cut(output[0, len(prompt):].tolist(), eos, max_new_tokens)
    return tokens, forwards_until_done(known, tokens), dict(zip([1, *known], drafted))


def upstream_prefill(model, package, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(last hidden state [1, H], greedy next token [1]) of upstream's own prefill of `prompt`."""
    llm = model.llm
    cache = package.kv_cache.Cache(batch_size=1, max_length=len(prompt) + 1,
                                   n_layers=llm.config.num_hidden_layers, n_heads=llm.config.num_key_value_heads,
                                   head_dim=llm.config.hidden_size // llm.config.num_attention_heads,
                                   dtype=llm.dtype, device=torch.device("cpu"))
    with torch.inference_mode():
        return package.recurrent_drafting._comprehend_prompt(
            llm, torch.tensor([prompt]), cache, package.recurrent_drafting.SamplingArgs(1.0, True), NO_PAD)


def upstream_outputs(job: dict) -> dict:
    """The side environment's part: {"hidden": the last hidden state of upstream's prefill of the first prompt,
    "runs": {"WxL": per prompt {"tokens", "forwards", "drafted"}}}."""
    model, package = upstream_models(Path(job["checkout"]), Path(job["model_dir"]), Path(job["drafter_dir"]),
                                     job["theta"])
    runs = {f"{width}x{length}": [dict(zip(("tokens", "forwards", "drafted"),
                                           upstream_run(model, package, prompt, width, length, job["eos"],
                                                        job["max_new_tokens"])))
                                  for prompt in job["prompts"]] for width, length in job["beams"]}
    return {"hidden": upstream_prefill(model, package, job["prompts"][0])[0][0].tolist(), "runs": runs}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(upstream_outputs(job)))


if __name__ == "__main__":
    main()
