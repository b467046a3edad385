"""Our DFlash drafter beside the dflash package's `dflash_generate` on the same weights, target and prompts.

    ~/.cache/specbench/dflash-venv/bin/python -m benchmarks.dflash_parity [--checkpoint DIR] [--questions 81,82]
        [--max-new-tokens 64] [--block-size N]

Runs in a side environment that has the `dflash` package (pip install --no-deps dflash==0.1.0 into a venv made with
--system-site-packages, so it reuses this machine's torch and transformers). Both sides decode MT-bench's first turns
(our chat template) greedily in float32 on SmolLM2-135M. The checkpoint (default: the committed one) is copied to a
temporary folder in the published layout upstream loads with DFlashDraftModel.from_pretrained (our `specbench_method`
field and draft-vocabulary ids dropped), so both sides draft over the whole vocabulary there; our drafter over the
committed slice is a third row. Prints per prompt and in total: tokens per decode step (#MAT, the prefill's token not
counted), the share of decode steps accepting at least 1..4 drafts, and whether the tokens and the per-step
acceptance lengths are equal.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.models import eos_token_ids, load_model
from methods.dflash.drafter import DFlashDrafter
from methods.heads.saved import VOCABULARY_KEY

COMMITTED = "artifacts/dflash/smollm2_135m"


def published_copy(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint as upstream loads it: config.json without our fields, weights without the vocabulary ids."""
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("specbench_method", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v for k, v in load_file(checkpoint / "model.safetensors").items() if k != VOCABULARY_KEY}
    save_file(tensors, folder / "model.safetensors")
    return folder


def upstream_run(folder: Path, target, prompt: list[int], max_new_tokens: int, eos: list[int],
                 block_size: int | None) -> tuple[list[int], list[int]]:
    """(new tokens, tokens per decode step) of the dflash package's dflash_generate, greedy."""
    import dflash.model as upstream

    upstream._cuda_time = time.perf_counter  # its stats timer synchronises CUDA; the counts are what is compared
    drafter = upstream.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = upstream.dflash_generate(drafter, target, torch.tensor([prompt]), max_new_tokens, eos, temperature=0.0,
                                   block_size=block_size, return_stats=True)
    return out.output_ids[0, len(prompt):].tolist(), list(out.acceptance_lengths)


@torch.inference_mode()
def first_blocks(folder: Path, target, prompt: list[int]) -> tuple[list[int], list[int]]:
    """The first drafted block after the prompt, upstream's (its DFlashDraftModel forward over
    extract_context_feature's features, as dflash_generate's first step calls it) and ours (DFlashDrafter.propose)."""
    import dflash.model as upstream

    model = upstream.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = target(torch.tensor([prompt]), output_hidden_states=True)
    root, size = int(out.logits[0, -1].argmax()), model.block_size
    features = upstream.extract_context_feature(out.hidden_states, model.target_layer_ids)
    block = torch.tensor([[root] + [model.mask_token_id] * (size - 1)])
    hidden = model(target_hidden=features, noise_embedding=target.get_input_embeddings()(block),
                   position_ids=torch.arange(len(prompt) + size)[None])[:, 1:]
    theirs = model.compute_logits(hidden, target.lm_head).argmax(-1)[0].tolist()
    ours = DFlashDrafter(target, checkpoint=str(folder))
    ours.start(prompt, hidden=torch.cat([out.hidden_states[i][0] for i in ours.feature_layers], dim=-1))
    return theirs, list(ours.propose(prompt + [root], size + 1).tokens)


def ours_run(checkpoint: Path, target, prompt: list[int], max_new_tokens: int, eos: list[int],
             block_size: int | None) -> tuple[list[int], list[int]]:
    drafter = DFlashDrafter(target, checkpoint=str(checkpoint), block_size=block_size)
    out = SpeculativeEngine(target, drafter).generate(prompt, StopCondition(max_new_tokens, frozenset(eos)))
    return out.tokens, out.accept_lengths


def mat(lengths: list[int]) -> float:
    return sum(lengths) / max(len(lengths), 1)


def main(argv: list[str] | None = None) -> None:
    from tasks import first_turn_prompts, read_questions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=COMMITTED)
    parser.add_argument("--questions", default="81,82")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=None)
    args = parser.parse_args(argv)
    target, tokenizer = load_model(compose_config("model=smollm2_135m").model, torch.device("cpu"))
    eos = sorted(eos_token_ids(target, tokenizer))
    wanted = [int(q) for q in args.questions.split(",")]
    questions = [q for q in read_questions() if q["question_id"] in wanted]
    prompts = first_turn_prompts(tokenizer, questions)
    checkpoint = Path(args.checkpoint)
    rows = {"upstream (dflash 0.1.0, whole vocabulary)": [], "ours (whole vocabulary)": [],
            "ours (committed draft vocabulary)": []}
    with tempfile.TemporaryDirectory() as tmp:
        copy = published_copy(checkpoint, Path(tmp))
        for question, prompt in zip(questions, prompts):
            runs = [upstream_run(copy, target, prompt, args.max_new_tokens, eos, args.block_size),
                    ours_run(copy, target, prompt, args.max_new_tokens, eos, args.block_size),
                    ours_run(checkpoint, target, prompt, args.max_new_tokens, eos, args.block_size)]
            for row, run in zip(rows.values(), runs):
                row.append(run)
            same = runs[0] == runs[1]
            theirs, ours = first_blocks(copy, target, prompt)
            print(f"question {question['question_id']}: first block upstream {theirs}, ours {ours}: "
                  f"{'equal' if theirs == ours else 'DIFFERENT'}")
            print(f"question {question['question_id']}: #MAT upstream {mat(runs[0][1]):.3f}, ours {mat(runs[1][1]):.3f}"
                  f", ours (slice) {mat(runs[2][1]):.3f}; whole-vocabulary tokens and steps equal: {same}")
    print("| side | #MAT | steps accepting >= 1 / 2 / 3 / 4 drafts | tokens | decode steps "
          "| tokens equal to upstream's | steps equal |")
    print("|---|---|---|---|---|---|---|")
    reference = rows["upstream (dflash 0.1.0, whole vocabulary)"]
    for name, runs in rows.items():
        lengths = [n for _, steps in runs for n in steps]
        tokens_equal = all(run[0] == ref[0] for run, ref in zip(runs, reference))
        steps_equal = all(run[1] == ref[1] for run, ref in zip(runs, reference))
        at_least = " / ".join(f"{sum(n > k for n in lengths) / max(len(lengths), 1):.3f}" for k in range(1, 5))
        print(f"| {name} | {mat(lengths):.3f} | {at_least} | {sum(len(t) for t, _ in runs)} | {len(lengths)} | "
              f"{tokens_equal} | {steps_equal} |")


if __name__ == "__main__":
    main()
