"""EAGLE-2's drafter (`method=eagle2`): EAGLE's head drafting a dynamic tree, built as upstream's `topK_genrate`.

The root's `top_k` children, then `depth` expansions of the `top_k` frontier nodes of highest cumulative
log-probability, each adding all `top_k` x `top_k` children as candidates; the `total_token - 1` best candidates are
verified, so a step verifies `total_token` tokens with the root (60 at upstream's 60/5/10). Drafted by top-k under
sampling too (as upstream): a deterministic tree that the engine verifies with the target's probabilities alone.
EAGLE-3 (methods/eagle3/) and SAM-Decoding's eagle2 fallback draft with it.
"""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.eagle.drafter import EagleDrafter
from methods.eagle.head import EagleHead
from methods.heads.common import DraftVocabulary
from methods.heads.tiny import random_weights


class Eagle2Drafter(EagleDrafter):
    """EAGLE-2's dynamic tree (`total_token`, `depth`, `top_k`) over an EAGLE head."""

    knob_rules = {"total_token": at_least(2), "depth": at_least(0), "top_k": at_least(1)}
    partial_drafts = True  # propose_first drafts only the levels its nodes need

    def __init__(self, target, tokenizer=None, checkpoint: str | None = "", total_token: int = 60, depth: int = 5,
                 top_k: int = 10, sampling: SamplingConfig | None = None, seed: int | None = None,
                 head: EagleHead | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(Eagle2Drafter, total_token=total_token, depth=depth, top_k=top_k)
        super().__init__(target, checkpoint, sampling, seed, head, vocab)
        self.depth, self.top_k, self.total_token = depth, top_k, total_token

    @torch.inference_mode()
    def propose_first(self, context: list[int], max_tokens: int, nodes: int) -> DraftTree | None:
        """propose's first `nodes` nodes, drafted with at most nodes - 1 expansions (see draft_tree)."""
        if max_tokens <= 1:
            return None
        return self.draft_tree(self._feed_pending(context), nodes)

    def most_nodes(self) -> int:
        return self.total_token - 1

    def fed_rows(self) -> int:
        """A level's top_k rows, or a step's accepted rows: the root and a path through 1 + depth levels."""
        return max(min(self.top_k, self.vocab.size), self.depth + 2)

    def draft_tree(self, root_feature: torch.Tensor, nodes: int | None = None) -> DraftTree | None:
        """EAGLE-2's tree. Level 1 is the root's top_k children; then `depth` expansions, each feeding the current
        frontier (top_k nodes) through the head and scoring all top_k x top_k children by cumulative log q; the next
        frontier is the best top_k of those. Every drafted node (top_k + depth x top_k^2 of them) is a candidate; the
        total_token - 1 best are verified (with the root: total_token tokens), best first, so that a prefix of the
        tree is the best smaller tree. Drafted by top-k under sampling too, as upstream does: the tree carries no
        draft probabilities and the engine verifies it with the target's alone (lossless: distinct deterministic
        siblings).

        With `nodes`, the first `nodes` nodes of that tree alone, from at most nodes - 1 expansions: a node never
        outranks its ancestors (its score is theirs plus log q <= 0, ties go to the older node), so a node at level
        L among the first `nodes` brings its L - 1 ancestors along (L <= nodes), and the levels drafted are the
        whole tree's first levels, computed alike."""
        nodes = self.total_token - 1 if nodes is None else min(nodes, self.total_token - 1)
        if nodes < 1:
            return None
        k, expansions = min(self.top_k, self.vocab.size), min(self.depth, nodes - 1)
        logq = self.vocab(root_feature[None]).float().log_softmax(-1)  # [1, V']
        scores, positions = logq.topk(k, dim=-1)  # [1, k]
        pool_positions, pool_scores = [positions[0]], [scores[0]]  # per level, flattened: [k], then [k * k] each
        pool_parents = [torch.full((k,), -1, device=self.device)]  # pool index of each node's parent (-1 root)
        frontier = torch.arange(k, device=self.device)  # pool indices of the nodes fed next
        frontier_scores, frontier_positions = scores[0], positions[0]
        inputs = root_feature[None].expand(k, -1)  # [k, H] each frontier node's parent's predicted feature
        # [k, k] additive (0: sees it, min: does not): a fed row sees itself among the rows fed with it
        sees_itself = torch.full((k, k), self._min_value, dtype=self.dtype, device=self.device).fill_diagonal_(0)
        sees_context = torch.zeros(k, self.context_len, dtype=self.dtype, device=self.device)  # [k, n] all of it
        tree_mask = sees_itself  # [k, fed] additive: frontier rows x fed tree rows
        size = k
        for level in range(expansions):
            features = self._feed_level(self.vocab.to_token_ids(frontier_positions), inputs,
                                        torch.cat([sees_context, tree_mask], dim=1), level)  # [k, H]
            child_scores, child_positions = self.vocab(features).float().log_softmax(-1).topk(k, dim=-1)  # [k, k]
            cumulative = (frontier_scores[:, None] + child_scores).flatten()  # [k * k]
            pool_positions.append(child_positions.flatten())
            pool_scores.append(cumulative)
            pool_parents.append(frontier.repeat_interleave(k))
            if level == expansions - 1:  # the last expansion's children are candidates only, never fed
                break
            best = cumulative.topk(k).indices  # the next frontier, as indices into this level's k * k children
            frontier, frontier_scores = size + best, cumulative[best]
            frontier_positions, inputs = child_positions.flatten()[best], features[best // k]
            tree_mask = torch.cat([tree_mask[best // k], sees_itself], dim=1)  # a node sees what its parent saw
            size += k * k
        scores = torch.cat(pool_scores)
        keep = scores.sort(descending=True, stable=True).indices[:nodes]  # ties: the older node
        tokens, parents, kept = torch.stack([self.vocab.to_token_ids(torch.cat(pool_positions)[keep]),
                                             torch.cat(pool_parents)[keep], keep]).tolist()  # the one host read
        index = {old: new for new, old in enumerate(kept)}
        assert all(p < 0 or p in index for p in parents), "a child never outranks its parent"
        return DraftTree(tokens, [index[p] if p >= 0 else -1 for p in parents])

    def _feed_level(self, token_ids: torch.Tensor, inputs: torch.Tensor, attention_mask: torch.Tensor,
                    level: int) -> torch.Tensor:
        """Feed one tree level (pairs of a node's token and its parent's predicted feature) after the cached context
        and the levels fed before; `attention_mask` [rows, n + fed] (additive) says which cached positions (the
        context and the fed tree rows, this level's last) each row sees. Returns the rows' predicted features
        [rows, H]."""
        positions = torch.full((1, len(token_ids)), self.context_len + level, device=self.device)
        return self.network({"embeds": self.embed(token_ids[None]), "features": inputs[None]}, positions,
                            attention_mask)[0]


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> Eagle2Drafter:
    """For the tests: this drafter at `knobs`' tree over a random head for a tiny target
    (tests/test_sampling_methods.py)."""
    head = random_weights(EagleHead(target.config), seed=2).to(target.dtype)
    return Eagle2Drafter(target, head=head, total_token=knobs["total_token"], depth=knobs["depth"],
                         top_k=knobs["top_k"], sampling=sampling, seed=0)

