"""Medusa's drafter (`method=medusa`): the static tree of the heads' top-k candidates."""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DeviceTokens, DraftTree
from bench.knobs import at_least, check_knobs, null_or
from methods.heads.common import DraftVocabulary, LastFeatureDrafter, heads_or_checkpoint
from methods.heads.tiny import random_weights
from methods.heads.trees import choices_rule, static_tree
from methods.medusa.checkpoints import load_medusa
from methods.medusa.heads import MedusaHeads


class MedusaDrafter(LastFeatureDrafter):
    """Proposes Medusa's static tree: node (head k, rank r) is head k's r-th most likely token."""

    knob_rules = {"choices": null_or(choices_rule), "tree_size": null_or(at_least(1))}
    partial_drafts = True  # propose_first runs only the heads its nodes need

    def __init__(self, target, tokenizer=None, checkpoint: str = "", choices: str | list[list[int]] | None = None,
                 tree_size: int | None = None, heads: MedusaHeads | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(MedusaDrafter, choices=choices, tree_size=tree_size)
        self.heads, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target, load_medusa)
        self.template, node_heads, node_ranks = static_tree(choices, tree_size, self.heads.num_heads, "Medusa")
        self.top_k = int(node_ranks.max()) + 1
        self.heads_for = [head + 1 for head in node_heads.tolist()]  # nodes' head count, on the host: no sync
        device = target.device
        self.node_heads, self.node_ranks = node_heads.to(device), node_ranks.to(device)
        self.templates = {}

    def most_nodes(self) -> int:
        return len(self.template)

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        """The static tree with this step's candidates, left on the device: the engine reads them back with its
        acceptance copy, so drafting makes no host sync."""
        return self.propose_first(context, max_tokens, len(self.template))

    @torch.inference_mode()
    def propose_first(self, context: list[int], max_tokens: int, nodes: int) -> DraftTree | None:
        """The tree's first `nodes` nodes, from the heads down to the deepest of them only."""
        if max_tokens <= 1 or nodes < 1:
            return None
        heads = max(self.heads_for[:nodes])
        candidates = torch.stack([self.heads.logits(self.hidden, self.vocab, k).topk(self.top_k).indices
                                  for k in range(heads)])  # [heads, top_k]
        tokens = self.vocab.to_token_ids(candidates[self.node_heads[:nodes], self.node_ranks[:nodes]])  # [nodes]
        return self.template_of(nodes).with_tokens(DeviceTokens(tokens))


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> MedusaDrafter:
    """For the tests: this drafter at `knobs`' tree over 4 random heads for a tiny target
    (tests/test_sampling_methods.py)."""
    heads = random_weights(MedusaHeads(target.config.hidden_size, 4), seed=1).to(target.dtype)
    return MedusaDrafter(target, choices=knobs["choices"], tree_size=knobs["tree_size"], heads=heads)
