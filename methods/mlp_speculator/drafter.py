"""MLPSpeculator's drafter (`method=mlp_speculator`): the best candidate sequences of the stages, verified as a tree."""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs, null_or
from methods.heads.common import DraftVocabulary, LastFeatureDrafter, heads_or_checkpoint
from methods.heads.tiny import random_weights
from methods.mlp_speculator.checkpoints import load_mlp_speculator
from methods.mlp_speculator.head import MLPSpeculatorStages, PublishedMLPSpeculator


def top_k_rule(value, knobs: dict) -> str | None:
    """bench.knobs rule of `top_k_tokens_per_head`: positive counts, one per drafted stage when n_predict is given."""
    if not value or any(not isinstance(k, int) or k < 1 for k in value):
        return "must be a list of integers >= 1, one per stage"
    n_predict = knobs.get("n_predict")
    if n_predict is not None and len(value) != n_predict:
        return f"must have n_predict={n_predict} entries"
    return None


class MLPSpeculatorDrafter(LastFeatureDrafter):
    """Drafts as fms-extras' generate_suffixes: from the target's feature h at the last accepted token and that
    token, stage i keeps its `top_k_tokens_per_head[i]` best tokens for each candidate so far (each with its own
    state, conditioned on its own last token), summing log-probabilities; the `n_candidates` best sequences are
    verified together, their shared prefixes merged into one tree. Proposals are deterministic (the engine's lossless
    acceptance rules apply). Knobs left null take the checkpoint's config.json values."""

    knob_rules = {"n_predict": null_or(at_least(1)), "top_k_tokens_per_head": null_or(top_k_rule),
                  "n_candidates": null_or(at_least(1))}

    def __init__(self, target, tokenizer=None, checkpoint: str = "", n_predict: int | None = None,
                 top_k_tokens_per_head: list[int] | None = None, n_candidates: int | None = None,
                 heads: MLPSpeculatorStages | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(MLPSpeculatorDrafter, n_predict=n_predict, top_k_tokens_per_head=top_k_tokens_per_head,
                    n_candidates=n_candidates)
        self.stages, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target,
                                                                     load_mlp_speculator)
        self.n_predict = n_predict or len(top_k_tokens_per_head or []) or self.stages.n_predict
        if self.n_predict > self.stages.n_predict:
            raise ValueError(f"MLPSpeculator: n_predict={self.n_predict} but the checkpoint has "
                             f"{self.stages.n_predict} stages; use method.drafter.n_predict <= {self.stages.n_predict}")
        self.top_k = list(top_k_tokens_per_head or self.stages.candidates["top_k_tokens_per_head"])[:self.n_predict]
        if len(self.top_k) < self.n_predict:
            raise ValueError(f"MLPSpeculator: top_k_tokens_per_head {self.top_k} has fewer than n_predict="
                             f"{self.n_predict} entries; set method.drafter.top_k_tokens_per_head")
        self.n_candidates = n_candidates or self.stages.candidates["n_candidates"]

    def most_nodes(self) -> int:
        """n_candidates sequences of n_predict tokens, shared prefixes merged."""
        return self.n_candidates * self.n_predict

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
            return None
        sequences = self.candidates(context[-1], min(self.n_predict, max_tokens - 1))
        return tree_of_sequences(sequences.tolist())

    @torch.inference_mode()
    def candidates(self, root: int, depth: int) -> torch.Tensor:
        """The best `n_candidates` token sequences of `depth` stages after `root`, best first: [n, depth]."""
        device = self.hidden.device
        state = self.stages.first_state(self.hidden[None])  # [1, H]: one candidate, the empty sequence
        tokens = torch.tensor([root], device=device)  # each candidate's last token
        sequences = torch.empty(1, 0, dtype=torch.long, device=device)
        scores = torch.zeros(1, device=device)
        for stage in range(depth):
            state = self.stages.advance(stage, state, tokens)  # [k, H]
            logprobs = torch.log_softmax(self.stages.logits(stage, state, self.vocab).float(), dim=-1)
            best, positions = logprobs.topk(self.top_k[stage], dim=-1)  # [k, k']
            kept = positions.shape[-1]
            sequences = torch.cat([sequences.repeat_interleave(kept, dim=0),
                                   self.vocab.to_token_ids(positions).reshape(-1, 1)], dim=1)
            scores = (scores[:, None] + best).reshape(-1)
            state, tokens = state.repeat_interleave(kept, dim=0), sequences[:, -1]
        return sequences[scores.topk(min(self.n_candidates, len(scores))).indices]


def tree_of_sequences(sequences: list[list[int]]) -> DraftTree:
    """One tree holding every sequence, shared prefixes merged; nodes in order of first appearance by depth, so
    parents come before children."""
    nodes: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for depth in range(max(map(len, sequences))):
        for sequence in sequences:
            prefix = tuple(sequence[: depth + 1])
            if len(prefix) == depth + 1 and prefix not in nodes:
                nodes[prefix] = len(tokens)
                tokens.append(prefix[-1])
                parents.append(nodes[prefix[:-1]] if depth else -1)
    return DraftTree(tokens, parents)


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> MLPSpeculatorDrafter:
    """For the tests: this drafter at `knobs` over 3 random published-layout stages for a tiny target
    (tests/test_sampling_methods.py)."""
    hidden, vocab = target.config.hidden_size, target.get_output_embeddings().weight.shape[0]
    stages = random_weights(PublishedMLPSpeculator(hidden, hidden, vocab, 3), seed=3).to(target.dtype)
    return MLPSpeculatorDrafter(target, heads=stages, **knobs)
