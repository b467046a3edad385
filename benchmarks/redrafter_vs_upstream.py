"""ReDrafter beside apple/ml-recurrent-drafter's PyTorch code: the same drafter, target and prompt ids, greedy.

    <python with jsonlines and tabulate> -m benchmarks.redrafter_vs_upstream --upstream DIR [--beam 4x4,45x5]

DIR is a checkout of apple/ml-recurrent-drafter (its `recurrent_drafting` package, which needs torch, transformers,
jsonlines and tabulate; a venv with --system-site-packages and `pip install --no-deps jsonlines tabulate` is enough).
Our committed SmolLM2 drafter is rewritten in upstream's layout (methods/redrafter/to_upstream.py) and loaded by
upstream's `AutoModel` registration; the target is SmolLM2-135M in float32, dequantized once (benchmarks/vs_upstream.py
`side_model_dir`) and loaded by upstream's own Llama (`recurrent_drafting.modeling_llama`), run by
`RecurrentDrafting.generate` with greedy_search=True. Ours is `SpeculativeEngine` with `ReDrafterDrafter` on our
loaded target. Both decode MT-bench 81-82, both turns (benchmarks/vs_upstream.py `mt_bench_prompts`), 64 tokens;
upstream stops at the tokenizer's one EOS (ours at any of the target's). Printed per beam shape: #MAT (tokens per
target forward, the prefill included, docs/parity.md), whether the tokens are equal, and whether the first proposal
(the beams at the prompt's end) is equal.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.artifacts import cache_dir
from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.models import eos_token_ids, load_model
from benchmarks.upstream_driver import cut, forwards_until_done, running_sums
from benchmarks.vs_upstream import decode_step_lengths, mt_bench_prompts, rope_theta, side_model_dir
from methods.redrafter.drafter import ReDrafterDrafter
from methods.redrafter.to_upstream import write_upstream_layout

MAX_NEW_TOKENS = 64
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


def upstream_run(model, package, prompt: list[int], width: int, length: int,
                 eos: int) -> tuple[list[int], int, dict[int, list]]:
    """(tokens cut at MAX_NEW_TOKENS or EOS, target forwards until they were known, {new tokens known: the beams
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
                                     len(prompt) + MAX_NEW_TOKENS, beam, args, special):
            known.append(output.shape[1] - len(prompt))
    finally:
        del model.drafter.beam_search_candidates
    tokens = cut(output[0, len(prompt):].tolist(), eos, MAX_NEW_TOKENS)
    return tokens, forwards_until_done(known, tokens), dict(zip([1, *known], drafted))


def our_run(engine, drafter: ReDrafterDrafter, prompt: list[int], stop) -> tuple[list[int], int, dict[int, list]]:
    """(tokens, target forwards until they were known, {new tokens known: the full-length beams drafted there}) of
    our engine."""
    drafted, search = {}, drafter.beams
    known = {"now": 0}

    def propose(context: list[int], max_tokens: int):
        known["now"] = len(context) - len(prompt)
        return type(drafter).propose(drafter, context, max_tokens)

    def recording(root: int, length: int):
        beams = search(root, length)
        if length == drafter.beam_length:
            drafted[known["now"]] = beams.tolist()
        return beams

    drafter.propose, drafter.beams = propose, recording
    try:
        out = engine.generate(prompt, stop)
    finally:
        del drafter.propose, drafter.beams
    tokens = out.tokens[:MAX_NEW_TOKENS]
    return tokens, forwards_until_done(running_sums(decode_step_lengths(out), start=1), tokens), drafted


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="a checkout of apple/ml-recurrent-drafter")
    parser.add_argument("--beam", default="4x4,45x5", help="beam shapes WIDTHxLENGTH, comma-separated")
    parser.add_argument("--checkpoint", help="our drafter (default: the committed one, conf/method_model/redrafter)")
    args = parser.parse_args(argv)
    cfg = compose_config("method=redrafter", "model=smollm2_135m", "model.dtype=float32")
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    eos = sorted(eos_token_ids(target, tokenizer))
    checkpoint = args.checkpoint or cfg.method.drafter.checkpoint
    prompts = mt_bench_prompts(target, tokenizer, [81, 82], MAX_NEW_TOKENS, eos)
    ours = ReDrafterDrafter(target, checkpoint=checkpoint)
    drafter_dir = cache_dir() / "upstream" / "redrafter-smollm2_135m"
    write_upstream_layout(ours.drafter, ours.vocab, drafter_dir)
    model, package = upstream_models(Path(args.upstream), side_model_dir(cfg.model), drafter_dir,
                                     rope_theta(target.config))
    with torch.inference_mode():  # the same target on both sides
        ours_state = target(input_ids=torch.tensor([prompts[0]]), output_hidden_states=True).hidden_states[-1][0, -1]
    difference = (upstream_prefill(model, package, prompts[0])[0][0] - ours_state).abs().max()
    print(f"upstream's Llama vs ours, last hidden state of the first prompt: max |difference| {float(difference):.2e}")
    print("| beam (width x length) | our #MAT | upstream #MAT | difference | tokens equal | first beams equal | "
          "beams equal where both drafted |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    stop = StopCondition(MAX_NEW_TOKENS, frozenset(eos))
    for shape in args.beam.split(","):
        width, length = map(int, shape.split("x"))
        drafter = ReDrafterDrafter(target, checkpoint=checkpoint, beam_width=width, beam_length=length)
        engine = SpeculativeEngine(target, drafter)
        mine, theirs, same_tokens, same_first, shared, same_beams = [0, 0], [0, 0], 0, 0, 0, 0
        for prompt in prompts:
            tokens, forwards, drafted = our_run(engine, drafter, prompt, stop)
            up_tokens, up_forwards, up_drafted = upstream_run(model, package, prompt, width, length,
                                                              tokenizer.eos_token_id)
            mine = [mine[0] + len(tokens), mine[1] + forwards]
            theirs = [theirs[0] + len(up_tokens), theirs[1] + up_forwards]
            same_tokens += tokens == up_tokens
            same_first += drafted.get(1) == up_drafted.get(1)
            both = drafted.keys() & up_drafted.keys()
            shared += len(both)
            same_beams += sum(drafted[p] == up_drafted[p] for p in both)
        ours_mat, up_mat = mine[0] / mine[1], theirs[0] / theirs[1]
        print(f"| {width} x {length} | {ours_mat:.3f} | {up_mat:.3f} | {100 * (ours_mat / up_mat - 1):+.1f}% | "
              f"{same_tokens}/{len(prompts)} | {same_first}/{len(prompts)} | {same_beams}/{shared} |", flush=True)

if __name__ == "__main__":
    main()
