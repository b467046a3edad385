"""Acceptance rules: which path of a verified draft tree to keep. Pure functions over the verifier's logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.sampling import SamplingConfig, logits_to_probs, sample
from bench.tree import DraftTree


@dataclass
class Acceptance:
    """rows: input rows of the kept path, starting with the root (row 0; node i is row i + 1).
    tokens: the accepted draft tokens followed by the bonus token the target picked after them."""

    rows: list[int]
    tokens: list[int]

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.rows) - 1


def greedy_accept(logits: torch.Tensor, tree: DraftTree | None) -> Acceptance:
    """Longest path whose every token equals the target's argmax after its parent. logits: [L, vocab]."""
    if tree is None or not len(tree):
        return Acceptance([0], [int(logits[0].argmax())])
    return greedy_path(logits[: 1 + len(tree)].argmax(-1).tolist(), tree)  # the one host sync of the step


def greedy_path(target: list[int], tree: DraftTree | None) -> Acceptance:
    """greedy_accept given the target's argmax token at each input row (root first), already on the host."""
    row, rows, tokens = 0, [0], []
    while True:
        token = target[row]
        tokens.append(token)
        if tree is None:
            return Acceptance(rows, tokens)
        child = next((c for c in tree.children[row] if tree.tokens[c] == token), None)
        if child is None:
            return Acceptance(rows, tokens)
        row = child + 1
        rows.append(row)


def speculative_sampling_accept(
    logits: torch.Tensor, tree: DraftTree | None, cfg: SamplingConfig, generator: torch.Generator | None
) -> Acceptance:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), extended to sibling candidates by
    SpecInfer's multi-step rejection (Miao et al. 2023). Lossless: tokens are distributed as the target's.

    At each accepted node, its children are tried in order: child x drawn from q is kept with probability
    min(1, p(x) / q(x)); on rejection p becomes norm(max(0, p - q)). A deterministic proposal has q = one-hot(x).
    Siblings drawn from one q without replacement (tree.siblings == "without_replacement", EAGLE's sampled trees)
    also remove the rejected x from q and renormalise it before the next sibling (SpecTr; Li et al. 2024).
    When no child is kept, the bonus token is drawn from the current p. logits: [L, vocab].
    """
    without_replacement = tree is not None and tree.siblings == "without_replacement"
    row, rows, tokens = 0, [0], []
    while True:
        p = logits_to_probs(logits[row], cfg).cpu()  # [vocab]
        kept, q = None, None
        for node in (tree.children[row] if tree is not None and len(tree) else ()):
            token = tree.tokens[node]
            if tree.draft_probs is None:
                q = torch.zeros_like(p)
                q[token] = 1.0
            elif q is None or not without_replacement:
                q = tree.draft_probs[node].float().cpu().clone()
            if torch.rand(1, generator=generator).item() * q[token].item() < p[token].item():
                kept = node
                break
            residual = (p - q).clamp_(min=0)
            if without_replacement:
                q[token] = 0.0
                q /= q.sum().clamp(min=1e-30)
            total = residual.sum()
            if total <= 0:  # p == q up to rounding: rejection had probability ~0
                continue
            p = residual / total
        if kept is None:
            tokens.append(sample(p, generator))
            return Acceptance(rows, tokens)
        tokens.append(tree.tokens[kept])
        row = kept + 1
        rows.append(row)
