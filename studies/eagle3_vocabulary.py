"""EAGLE-3's draft vocabulary size (coverage against cost) and its loss target (the target's top 64 against its full
softmax), measured on the self-distilled answers the heads train on.

    python -m studies.eagle3_vocabulary [--answers DIR] [--sizes 2048,4096,8192,12288,16384,32768]

Coverage: the draft vocabulary of size N is the N target predictions most frequent over the training answers (as
the recipe picks it; on self-distilled answers the target's greedy prediction at an answer position is the next
answer token); coverage is the share of held-out answer positions (the first `--heldout` answers, the training
pipeline's held-out shard) whose prediction lies in it: a draft outside it can never be accepted. Cost: one drafted
level's output layer ([top_k, hidden] x [hidden, N], log-softmax, top-k) beside the head's transformer layer, the
median of `--repeats` calls (time it on a quiet machine), and the head's size in fp16 (a committed head stays under
25 MB). Loss target: over the held-out sequences' answer positions, the target's probability mass outside its top 64,
and the total-variation distance between the training target made from the top 64 (their softmax renormalised over
the draft vocabulary: what the feature cache stores) and the one made from the full softmax, for the committed head's
vocabulary.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.artifacts import PROJECT_ROOT
from bench.models import load_model
from methods.heads.common import most_frequent_tokens
from methods.heads.self_distill import answer_block, answer_path

HEAD = PROJECT_ROOT / "artifacts" / "eagle3" / "smollm2_135m"


def read_answers(folder: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) pairs of every answer shard in `folder`, in order."""
    pairs, shard = [], 0
    while answer_path(folder, shard).exists():
        saved = torch.load(answer_path(folder, shard))
        pairs += list(zip(saved["prompts"], saved["answers"]))
        shard += 1
    return pairs


def coverage(train: list[list[int]], heldout: list[list[int]], sizes: list[int], vocab_size: int) -> dict[int, float]:
    """Share of held-out answer tokens inside each size's most-frequent-training-answer-token vocabulary."""
    labels = torch.tensor([t for answer in train for t in answer])
    wanted = torch.tensor([t for answer in heldout for t in answer])
    shares = {}
    for size in sizes:
        inside = torch.zeros(vocab_size, dtype=torch.bool)
        inside[most_frequent_tokens(labels, size, vocab_size, [])] = True
        shares[size] = inside[wanted].float().mean().item()
    return shares


def median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def level_cost(model, sizes: list[int], top_k: int, repeats: int) -> dict:
    """Seconds of one drafted level's output layer per vocabulary size, and of a decoder layer of the target's
    width (the head's one layer) for scale."""
    hidden = model.config.hidden_size
    states = torch.randn(1, top_k, hidden)
    rotary = model.model.rotary_emb(states, torch.arange(top_k)[None])
    layer = model.model.layers[0]
    cost = {"layer": median_seconds(lambda: layer(states, position_embeddings=rotary), repeats)}
    for size in sizes:
        weight = torch.randn(size, hidden) / hidden ** 0.5
        cost[size] = median_seconds(lambda: (states @ weight.T).log_softmax(-1).topk(top_k, dim=-1), repeats)
    return cost


@torch.inference_mode()
def loss_target_gap(model, pairs: list[tuple[list[int], list[int]]], vocab_ids: torch.Tensor, top: int) -> dict:
    """Mean mass outside the target's top `top` and mean total variation between the top-`top` and full-softmax
    training targets over the draft vocabulary, at the answer positions of `pairs`."""
    in_vocab = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    in_vocab[vocab_ids] = True
    outside, distances = [], []
    for prompt, answer in pairs:
        ids, mask = answer_block(prompt, answer, 256, 0)
        length = len(prompt) + len(answer)
        logits = model(torch.tensor([ids[:length]])).logits[0].float()[torch.tensor(mask[:length])]
        probs = logits.softmax(-1)
        top_logits, top_ids = logits.topk(top, dim=-1)
        outside += (1 - probs.gather(-1, top_ids).sum(-1)).tolist()
        full = probs * in_vocab
        full = full / full.sum(-1, keepdim=True)
        truncated = torch.zeros_like(probs).scatter(-1, top_ids, top_logits.softmax(-1)) * in_vocab
        truncated = truncated / truncated.sum(-1, keepdim=True)
        distances += (0.5 * (full - truncated).abs().sum(-1)).tolist()
    return {"positions": len(outside), "mass_outside_top": statistics.mean(outside),
            "p99_mass_outside_top": sorted(outside)[int(0.99 * len(outside))],
            "mean_total_variation": statistics.mean(distances), "max_total_variation": max(distances)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m studies.eagle3_vocabulary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, default=PROJECT_ROOT / "artifacts" / "answers" / "smollm2_135m")
    parser.add_argument("--sizes", default="2048,4096,8192,12288,16384,32768")
    parser.add_argument("--heldout", type=int, default=32, help="answers held out (the pipeline's first shard)")
    parser.add_argument("--top-k", type=int, default=2, help="tokens per drafted level (SmolLM2's CPU tree: 2)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--top", type=int, default=64, help="the cached soft targets' top-k")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    model, _ = load_model(OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "smollm2_135m.yaml"), torch.device("cpu"))
    pairs = read_answers(args.answers)
    heldout, train = pairs[: args.heldout], pairs[args.heldout :]
    shares = coverage([a for _, a in train], [a for _, a in heldout], sizes, model.config.vocab_size)
    cost = level_cost(model, sizes, args.top_k, args.repeats)
    from safetensors.torch import load_file

    weights = load_file(HEAD / "model.safetensors")
    hidden = model.config.hidden_size
    rest_mb = sum(t.numel() * t.element_size() for name, t in weights.items() if name not in ("lm_head.weight", "d2t"))
    print(f"{len(train)} training answers, {len(heldout)} held out; one level = {args.top_k} tokens; "
          f"the head's layer: {cost['layer'] * 1e3:.3f} ms")
    print("| draft vocabulary | held-out coverage | output layer ms / level | x the head's layer | head fp16 MB |")
    print("| --- | --- | --- | --- | --- |")
    for size in sizes:
        print(f"| {size} | {shares[size]:.4f} | {cost[size] * 1e3:.3f} | {cost[size] / cost['layer']:.2f} | "
              f"{(rest_mb + size * (hidden * 2 + 8)) / 1e6:.1f} |")
    vocab_ids = torch.arange(weights["d2t"].shape[0]) + weights["d2t"]
    gap = loss_target_gap(model, heldout, vocab_ids, args.top)
    print(f"loss target on {gap['positions']} held-out answer positions (the committed head's {len(vocab_ids)} "
          f"tokens): mass outside the top {args.top} {gap['mass_outside_top']:.2e} (p99 "
          f"{gap['p99_mass_outside_top']:.2e}); total variation top-{args.top} vs full softmax: mean "
          f"{gap['mean_total_variation']:.2e}, max {gap['max_total_variation']:.2e}")


if __name__ == "__main__":
    main()
