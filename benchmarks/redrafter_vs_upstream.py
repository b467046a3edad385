"""ReDrafter beside apple/ml-recurrent-drafter's PyTorch code, the `redrafter` rows of benchmarks/vs_upstream.py: the
same drafter, target and prompt ids, greedy, at beams 4 x 4 (SmolLM2's CPU setting) and 45 x 5 (upstream's
documented run, conf/method/redrafter.yaml).

    OMP_NUM_THREADS=1 python -m benchmarks.vs_upstream --methods redrafter

needs a checkout of apple/ml-recurrent-drafter (its `recurrent_drafting` package is enough; measured at bd8586b) in
$SPECBENCH_CACHE/redrafter-upstream. Upstream runs in the side environment $SPECBENCH_CACHE/redrafter-upstream/venv
(made on first use: this machine's torch and transformers plus REDRAFTER_PINS, what the package imports) as `python -m
benchmarks.redrafter_vs_upstream JOB OUT`. Our committed SmolLM2 drafter is rewritten in upstream's layout
(methods/redrafter/to_upstream.py) and built as upstream's Drafter; the target is the dequantized SmolLM2-135M
(vs_upstream `side_model_dir`) loaded by upstream's own Llama (`recurrent_drafting.modeling_llama`), run by
`RecurrentDrafting.generate` with greedy_search=True. Ours is `SpeculativeEngine` with `ReDrafterDrafter` on our
loaded target. Upstream stops at the tokenizer's one EOS (ours at any of the target's). Besides each row: whether the
first proposal (the beams at the prompt's end) is equal, and at every position where both sides drafted full-length
beams, whether the whole beam tensor is; and once, the largest difference between the last hidden state of
upstream's prefill of the first prompt and ours.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.artifacts import cache_dir
from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine
from benchmarks.upstream_driver import cut, forwards_until_done
from benchmarks.vs_upstream import (
    Comparison,
    Setup,
    counted_output,
    generate_recording,
    required_checkout,
    rope_theta,
    side_model_dir,
    side_outputs,
    side_venv,
)
from methods.redrafter.drafter import ReDrafterDrafter
from methods.redrafter.to_upstream import write_upstream_layout

REDRAFTER_PINS = ("jsonlines==4.0.0", "tabulate==0.10.0")
REDRAFTER_GET = "git clone https://github.com/apple/ml-recurrent-drafter {dir}"
BEAMS = [[4, 4], [45, 5]]  # SmolLM2's CPU setting; upstream's documented run
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


def our_run(engine, drafter: ReDrafterDrafter, prompt: list[int], stop) -> tuple[list[int], int, dict[int, list]]:
    """(tokens, target forwards until they were known, {new tokens known: the full-length beams drafted there}) of
    our engine."""
    out, drafted = generate_recording(engine, drafter, prompt, stop, "beams",
                                      keep=lambda length: length == drafter.beam_length)
    return (*counted_output(out, stop.max_new_tokens), drafted)


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


def comparisons(setup: Setup, tmp: Path) -> list[Comparison]:
    """The `redrafter` rows of vs_upstream: per beam shape, our engine and upstream's loop."""
    checkout = required_checkout(cache_dir() / "redrafter-upstream", "recurrent_drafting/recurrent_drafting.py",
                                 REDRAFTER_GET)
    target, stop = setup.model, setup.stop
    checkpoint = compose_config("method=redrafter", "model=smollm2_135m").method.drafter.checkpoint
    ours = ReDrafterDrafter(target, checkpoint=checkpoint)
    drafter_dir = tmp / "redrafter-upstream-layout"
    write_upstream_layout(ours.drafter, ours.vocab, drafter_dir)
    job = {"checkout": str(checkout), "model_dir": str(side_model_dir(setup.model_cfg)),
           "drafter_dir": str(drafter_dir), "theta": rope_theta(target.config), "prompts": setup.prompts,
           "beams": BEAMS, "eos": setup.tokenizer.eos_token_id, "max_new_tokens": stop.max_new_tokens}
    upstream = side_outputs(side_venv("redrafter-upstream/venv", REDRAFTER_PINS),
                            ["-m", "benchmarks.redrafter_vs_upstream"], job, tmp, "redrafter")
    with torch.inference_mode():  # the same target on both sides
        state = target(input_ids=torch.tensor([setup.prompts[0]]), output_hidden_states=True).hidden_states[-1][0, -1]
    hidden = ("redrafter: the last hidden state of the first prompt's prefill, upstream's Llama vs ours: max "
              f"|difference| {float((torch.tensor(upstream['hidden']) - state).abs().max()):.2e}")
    rows = []
    for width, length in BEAMS:
        drafter = ReDrafterDrafter(target, checkpoint=checkpoint, beam_width=width, beam_length=length)
        engine = SpeculativeEngine(target, drafter)
        mine = [our_run(engine, drafter, prompt, stop) for prompt in setup.prompts]
        theirs = [{**r, "drafted": {int(p): beams for p, beams in r["drafted"].items()}}
                  for r in upstream["runs"][f"{width}x{length}"]]
        rows.append(Comparison("redrafter", f"beams {width} x {length} vs apple/ml-recurrent-drafter "
                               "RecurrentDrafting.generate greedy", [(t, f) for t, f, _ in mine],
                               [(r["tokens"], r["forwards"]) for r in theirs],
                               [beam_agreement(f"{width} x {length}", [d for *_, d in mine],
                                               [r["drafted"] for r in theirs])]))
    rows[0].notes.insert(0, hidden)
    return rows


def beam_agreement(shape: str, ours: list[dict[int, list]], theirs: list[dict[int, list]]) -> str:
    """How many prompts' first beams are equal, and how many beams are where both sides drafted full-length ones
    (per prompt: {new tokens known: the beams drafted there})."""
    first = sum(mine.get(1) == other.get(1) for mine, other in zip(ours, theirs))
    both = [(mine[p], other[p]) for mine, other in zip(ours, theirs) for p in mine.keys() & other.keys()]
    return (f"redrafter {shape}: first beams equal {first}/{len(ours)}, beams equal where both drafted "
            f"{sum(a == b for a, b in both)}/{len(both)}")


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(upstream_outputs(job)))


if __name__ == "__main__":
    main()
