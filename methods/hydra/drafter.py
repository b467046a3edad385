"""Hydra's drafter (`method=hydra`): Medusa's static tree built level by level from sequentially dependent heads."""
from __future__ import annotations

import torch

from bench.engine.kvcache import new_cache
from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs, null_or
from methods.heads.common import DraftVocabulary, LastFeatureDrafter, heads_or_checkpoint
from methods.heads.tiny import random_weights
from methods.heads.trees import choices_rule, static_tree
from methods.hydra.checkpoints import load_hydra
from methods.hydra.heads import HydraHeads, HydraPrefixHeads


class HydraDrafter(LastFeatureDrafter):
    """Builds the static choices tree level by level; level d's tokens come from head d-1 reading each parent's path.
    With Hydra++ heads, h_t is the prefix layer's output, its cache fed the target's features of the accepted rows."""

    knob_rules = {"choices": null_or(choices_rule), "tree_size": null_or(at_least(1))}
    partial_drafts = True  # propose_first runs only the heads its nodes need

    def __init__(self, target, tokenizer=None, checkpoint: str = "", choices: str | list[list[int]] | None = None,
                 tree_size: int | None = None, heads: HydraHeads | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(HydraDrafter, choices=choices, tree_size=tree_size)
        self.heads, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target, load_hydra)
        self.embed = target.get_input_embeddings()
        self.template, node_heads, node_ranks = static_tree(choices, tree_size, self.heads.num_heads, "Hydra")
        self.templates = {}
        depth = int(node_heads.max()) + 1
        device = target.device
        # Per level: the parents that need children (node ids, -1 = root), their paths (node ids from depth 1 down
        # to the parent), and for each node of the level the row of its parent and its rank.
        self.levels = []
        parents, ranks = self.template.parents, node_ranks.tolist()
        for level in range(1, depth + 1):
            nodes = [i for i, d in enumerate(self.template.depths) if d == level]
            rows = sorted({parents[i] for i in nodes})
            paths = [self._path(p) for p in rows]
            self.levels.append((
                torch.tensor(nodes, device=device),
                torch.tensor(paths, dtype=torch.long, device=device).reshape(len(rows), level - 1),
                torch.tensor([rows.index(parents[i]) for i in nodes], device=device),
                torch.tensor([ranks[i] for i in nodes], device=device),
                max(ranks[i] for i in nodes) + 1,
            ))

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        if isinstance(self.heads, HydraPrefixHeads):
            self.prefix_cache = new_cache()
            hidden = self.heads.prefix_features(hidden, self.prefix_cache)
        super().start(prompt_ids, hidden)

    @torch.inference_mode()
    def update(self, step) -> None:
        if isinstance(self.heads, HydraPrefixHeads):
            self.hidden = self.heads.prefix_features(step.hidden[step.acceptance.rows], self.prefix_cache)[-1]
        else:
            super().update(step)

    def _path(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.template.parents[node]
        return path[::-1]

    def most_nodes(self) -> int:
        return len(self.template)

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        return self.propose_first(context, max_tokens, len(self.template))

    @torch.inference_mode()
    def propose_first(self, context: list[int], max_tokens: int, nodes: int) -> DraftTree | None:
        """The tree's first `nodes` nodes, from the levels (heads) down to the deepest of them only."""
        if max_tokens <= 1 or nodes < 1:
            return None
        depth = self.template.depths[nodes - 1]
        root = self.embed(torch.tensor([context[-1]], device=self.hidden.device))  # [1, H]
        tokens = torch.zeros(len(self.template), dtype=torch.long, device=self.hidden.device)
        for head, (nodes_at, paths, parent_rows, ranks, top_k) in enumerate(self.levels[:depth]):
            rows = paths.shape[0]
            path_embeds = torch.cat([root.expand(rows, 1, -1), self.embed(tokens[paths])], dim=1)  # [rows, head+1, H]
            logits = self.heads.logits(self.hidden.expand(rows, -1), path_embeds, self.vocab, head)
            candidates = self.vocab.to_token_ids(logits.topk(top_k, dim=-1).indices)  # [rows, top_k]
            tokens[nodes_at] = candidates[parent_rows, ranks]
        return self.template_of(nodes).with_tokens(tokens[:nodes].tolist())


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> HydraDrafter:
    """For the tests: this drafter at `knobs`' tree over 4 random heads for a tiny target
    (tests/test_sampling_methods.py)."""
    heads = random_weights(HydraHeads(target.config.hidden_size, 4), seed=2).to(target.dtype)
    return HydraDrafter(target, choices=knobs["choices"], tree_size=knobs["tree_size"], heads=heads)
