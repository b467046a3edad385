"""ReDrafter's drafter (`method=redrafter`): beam search over the recurrent drafter, beams merged into a prefix tree."""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.heads.common import DraftVocabulary, LastFeatureDrafter, heads_or_checkpoint
from methods.heads.tiny import random_weights
from methods.mlp_speculator.drafter import tree_of_sequences
from methods.redrafter.checkpoints import load_redrafter
from methods.redrafter.head import PublishedRecurrentDrafter, RecurrentDrafterHead

LOG_0 = -50000.0  # upstream's log(0): masked logits and the beams that start empty
WARP_TOP_K = 50  # upstream's compute_logits keeps each beam's 50 best logits (warp_logits' default)


def warped_log_probs(logits: torch.Tensor, top_k: int = WARP_TOP_K) -> torch.Tensor:
    """Upstream's `compute_logits` then log_softmax: logits minus their maximum, those below the k-th best set to
    LOG_0 (ties kept), normalised. [..., V'] -> [..., V'] float32."""
    logits = logits.float()
    logits = logits - logits.max(dim=-1, keepdim=True).values
    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, LOG_0).log_softmax(dim=-1)


class ReDrafterDrafter(LastFeatureDrafter):
    """Drafts as upstream's `Drafter.beam_search_candidates`: from the target's feature h at the last accepted token
    and the token the target chose there, `beam_width` beams grow `beam_length - 1` tokens, each step keeping the
    `beam_width` best (beam, token) pairs by summed log-probability over all beams (at the first step only one beam
    is live, the others start at log 0 = -50000). The beams are deduplicated into one prefix tree (upstream's dynamic
    tree attention) and verified together. Proposals are deterministic: greedy and sampled acceptance are the
    engine's lossless rules."""

    knob_rules = {"beam_width": at_least(1), "beam_length": at_least(2)}

    def __init__(self, target, tokenizer=None, checkpoint: str = "", beam_width: int = 45, beam_length: int = 5,
                 heads: RecurrentDrafterHead | None = None, vocab: DraftVocabulary | None = None):
        check_knobs(ReDrafterDrafter, beam_width=beam_width, beam_length=beam_length)
        self.drafter, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target, load_redrafter)
        self.beam_width, self.beam_length = beam_width, beam_length

    def most_nodes(self) -> int:
        """beam_width beams of beam_length - 1 drafted tokens, shared prefixes merged."""
        return self.beam_width * (self.beam_length - 1)

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
            return None
        beams = self.beams(context[-1], min(self.beam_length, max_tokens))
        return tree_of_sequences(beams[:, 1:].tolist())

    @torch.inference_mode()
    def beams(self, root: int, length: int) -> torch.Tensor:
        """The `beam_width` beams of `length` tokens (the root first), best first: [beam_width, length]."""
        width, device = self.beam_width, self.hidden.device
        context = self.hidden[None].expand(width, -1)
        log_p_beam = torch.full((width,), LOG_0, device=device)
        log_p_beam[0] = 0.0
        beams = torch.full((width, 1), root, dtype=torch.long, device=device)
        state = torch.zeros(width, self.drafter.hidden_size, dtype=self.hidden.dtype, device=device)
        for _ in range(length - 1):
            state = self.drafter.advance(state, beams[:, -1])
            log_p = warped_log_probs(self.drafter.logits(context, state, self.vocab))  # [width, V']
            log_p_beam, best = (log_p + log_p_beam[:, None]).reshape(-1).topk(width)
            parent, position = best // log_p.shape[-1], best % log_p.shape[-1]
            beams = torch.cat([beams[parent], self.vocab.to_token_ids(position)[:, None]], dim=1)
            state = state[parent]
        return beams


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> ReDrafterDrafter:
    """For the tests: this drafter at `knobs` over a random published-layout drafter (2 ResBlocks, RNN) for a tiny
    target (tests/test_sampling_methods.py)."""
    hidden, vocab = target.config.hidden_size, target.get_output_embeddings().weight.shape[0]
    drafter = random_weights(PublishedRecurrentDrafter(hidden, 2 * hidden, 2, True, vocab), seed=3)
    drafter = drafter.to(target.dtype).attach_embedding(target.get_input_embeddings())
    return ReDrafterDrafter(target, heads=drafter, **knobs)
