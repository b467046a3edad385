"""Acceptance rules: which path of a verified draft tree to keep. Pure functions over the verifier's logits.

Each rule reads the device once per step: greedy acceptance brings the target's argmax of every tree row to the
host in one copy (with the draft tokens of a drafter that left them on the device), speculative sampling the
target's probabilities of every tree row (with the draft's). Everything after that runs on the host."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.engine.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample
from bench.engine.tree import DraftTree


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
        return Acceptance([0], [int(greedy_tokens(logits[0]))])  # the one host sync of the step
    return greedy_path(host_with_drafts(greedy_tokens(logits[: 1 + len(tree)]), [tree]), tree)


def host_with_drafts(target: torch.Tensor, trees: list[DraftTree | None]) -> list:
    """target.tolist() ([L] or [B, L] token ids), in one device-to-host copy that also brings the trees' node
    tokens still on the device (DeviceTokens) to the host: the one host sync of a greedy step."""
    pending = [t.tokens for t in trees if t is not None and t.tokens_on_device and t.tokens.ids.device == target.device]
    if not pending:
        return target.tolist()
    values = torch.cat([target.flatten(), *(tokens.ids.long() for tokens in pending)]).tolist()
    start = target.numel()
    for tokens in pending:
        tokens.fill(values[start : start + len(tokens)])
        start += len(tokens)
    if target.dim() == 1:
        return values[: target.numel()]
    width = target.shape[-1]
    return [values[row * width : (row + 1) * width] for row in range(target.shape[0])]


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
    target, draft = probs_on_host([logits], [tree], cfg)[0]
    return sampling_path(target, draft, tree, generator)


def sampling_path(target: torch.Tensor, draft: torch.Tensor | None, tree: DraftTree | None,
                  generator: torch.Generator | None) -> Acceptance:
    """speculative_sampling_accept given the target's probabilities of the root and node rows ([1 + n, vocab]) and
    the tree's draft_probs (float32 or None), already on the host (probs_on_host)."""
    without_replacement = tree is not None and tree.siblings == "without_replacement"
    row, rows, tokens = 0, [0], []
    while True:
        p = target[row]  # [vocab]
        kept, q = None, None
        for node in (tree.children[row] if tree is not None and len(tree) else ()):
            token = tree.tokens[node]
            if draft is None:
                q = torch.zeros_like(p)
                q[token] = 1.0
            elif q is None or not without_replacement:
                q = draft[node].clone()
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


def probs_on_host(logits: list[torch.Tensor], trees: list[DraftTree | None], cfg: SamplingConfig
                  ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per tree (logits[i]: [L, vocab] of trees[i]'s step inputs): the target's probabilities [1 + n, vocab] of the
    root and node rows, and the tree's draft_probs [n, vocab] as float32 (None without), on the host. One
    device-to-host copy brings them all (draft_probs kept on another device come in a copy of their own)."""
    pairs = []
    for rows, tree in zip(logits, trees):
        target = logits_to_probs(rows[: 1 if tree is None else 1 + len(tree)], cfg)
        pairs.append((target, None if tree is None or tree.draft_probs is None else tree.draft_probs.float()))
    device = pairs[0][0].device
    together = [t for pair in pairs for t in pair if t is not None and t.device == device]
    copied = dict(zip(map(id, together), torch.cat(together).cpu().split([len(t) for t in together])))
    return [tuple(None if t is None else copied[id(t)] if id(t) in copied else t.cpu() for t in pair)
            for pair in pairs]
