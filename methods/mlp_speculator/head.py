"""MLPSpeculator's stages: the published layout (private embedding and vocabulary tables per stage) and this
project's CPU-sized one (the target's own embedding and LM head behind a private linear map per stage)."""
from __future__ import annotations

import math

import torch
from torch import nn

from methods.heads.common import DraftVocabulary

NORMS = ("rms", "layer")  # IBM's / vLLM's normalisation (no mean subtracted, eps 1e-6), or torch's nn.LayerNorm
# IBM's candidate settings for a 3-stage speculator (fms-extras' defaults), extended by the last value for deeper ones
FMS_TOP_K_TOKENS_PER_HEAD = (5, 4, 3)
FMS_N_CANDIDATES = 5


def candidate_settings(n_predict: int) -> dict:
    """config.json's `top_k_tokens_per_head` and `n_candidates` for a speculator of `n_predict` stages: fms-extras'
    defaults, cut or extended by their last value."""
    top_k = list(FMS_TOP_K_TOKENS_PER_HEAD[:n_predict])
    top_k += [FMS_TOP_K_TOKENS_PER_HEAD[-1]] * (n_predict - len(top_k))
    return {"top_k_tokens_per_head": top_k, "n_candidates": FMS_N_CANDIDATES}


class RMSNormWithShift(nn.Module):
    """IBM's speculator norm (fms LayerNormParameterized without the mean, vLLM's MLPSpeculatorLayerNorm):
    x / sqrt(mean(x^2) + eps), then, with `affine`, times `weight` plus `bias`."""

    def __init__(self, size: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size)) if affine else None
        self.bias = nn.Parameter(torch.zeros(size)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x if self.weight is None else x * self.weight + self.bias


def stage_norm(kind: str, size: int) -> nn.Module:
    return RMSNormWithShift(size) if kind == "rms" else nn.LayerNorm(size)


class MLPSpeculatorStages(nn.Module):
    """The state recursion both layouts share. Stage i (0-based) maps the running state s (at stage 0 the target's
    last hidden state h, first normalised and divided by sqrt(2) when `scale_input`) and the embedding z of the token
    before the one it guesses to

        s' = GELU(ln_i(state_weight * proj_i(s) + emb_weight * z)),   logits_i = head_i(s')

    with state_weight = 0.5 ** (0.5 / n_predict) and emb_weight = sqrt((1 - state_weight^2) * inner_dim / 2). As
    upstream computes it, the sum is divided by state_weight before the norm (proj_i(s) + emb_weight / state_weight
    z), which the norm makes the same up to its eps. Subclasses give `embed(i, tokens)` and `logits(i, state, vocab)`.
    `candidates` holds the checkpoint's top_k_tokens_per_head and n_candidates (fms-extras' defaults until a loader
    sets them).
    """

    def __init__(self, emb_dim: int, inner_dim: int, n_predict: int, scale_input: bool = False, norm: str = "rms",
                 tie_weights: bool = False):
        super().__init__()
        self.emb_dim, self.inner_dim, self.n_predict = emb_dim, inner_dim, n_predict
        self.state_weight = 0.5 ** (0.5 / n_predict)
        self.emb_weight = math.sqrt((1 - self.state_weight ** 2) * (inner_dim / 2))
        self.proj = _stages(n_predict, tie_weights, lambda i: nn.Linear(emb_dim if i == 0 else inner_dim, inner_dim,
                                                                        bias=False), tie_from=1)
        self.ln = _stages(n_predict, tie_weights, lambda i: stage_norm(norm, inner_dim))
        self.ln0 = RMSNormWithShift(emb_dim, affine=False) if scale_input else None
        self.activation = nn.GELU()
        self.candidates = candidate_settings(n_predict)

    def first_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., emb_dim] target features -> the state stage 0 reads."""
        return hidden if self.ln0 is None else self.ln0(hidden) / math.sqrt(2)

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The state after stage `stage` ([..., inner_dim]) from the one before and the tokens it is conditioned on."""
        mixed = self.proj[stage](state) + self.embed(stage, tokens) * (self.emb_weight / self.state_weight)
        return self.activation(self.ln[stage](mixed))

    def embed(self, stage: int, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, stage: int, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        raise NotImplementedError


class PublishedMLPSpeculator(MLPSpeculatorStages):
    """IBM's layout (fms-extras' MLPSpeculator, vLLM's and TGI's): per stage an embedding table [vocab, inner_dim] and a
    vocabulary head [vocab, inner_dim] of its own. `tie_weights` shares one embedding, one head, one norm, and one
    projection for stages 1.. (stage 0's reads the target's width)."""

    def __init__(self, emb_dim: int, inner_dim: int, vocab_size: int, n_predict: int, tie_weights: bool = False,
                 scale_input: bool = False, norm: str = "rms"):
        super().__init__(emb_dim, inner_dim, n_predict, scale_input, norm, tie_weights)
        self.emb = _stages(n_predict, tie_weights, lambda i: nn.Embedding(vocab_size, inner_dim))
        self.head = _stages(n_predict, tie_weights, lambda i: nn.Linear(inner_dim, vocab_size, bias=False))

    def embed(self, stage: int, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb[stage](tokens)

    def logits(self, stage: int, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        """Full-vocabulary logits (the vocabulary passed in is the target's whole one)."""
        return self.head[stage](state)


class SharedVocabMLPSpeculator(MLPSpeculatorStages):
    """This project's CPU-sized layout: the stages read the target's own token embedding through a private linear map
    (`emb_in.{i}`) and score through a private linear map (`out.{i}`) into the target's LM head (or its draft-vocabulary
    slice), instead of two [vocab, inner_dim] tables per stage (2 x 28M parameters for SmolLM2). inner_dim is the
    target's hidden size. The target's embedding is held as a frozen, unsaved buffer (`attach_embedding`)."""

    def __init__(self, hidden_size: int, n_predict: int, scale_input: bool = False):
        super().__init__(hidden_size, hidden_size, n_predict, scale_input)
        self.emb_in = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=False) for _ in range(n_predict))
        self.out = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(n_predict))
        for layer in (*self.emb_in, *self.out):  # start from the identity: the target's own tables
            nn.init.eye_(layer.weight)
        for layer in self.out:
            nn.init.zeros_(layer.bias)
        self.register_buffer("target_embedding", None, persistent=False)

    def attach_embedding(self, embedding: nn.Embedding) -> SharedVocabMLPSpeculator:
        """Read the target's token embedding table (frozen, not saved with the weights)."""
        self.target_embedding = embedding.weight.detach()
        return self

    def embed(self, stage: int, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb_in[stage](self.target_embedding[tokens].to(self.emb_in[stage].weight.dtype))

    def logits(self, stage: int, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        return vocab(self.out[stage](state))


def _stages(n_predict: int, tied: bool, make, tie_from: int = 0) -> nn.ModuleList:
    """n_predict modules `make(i)`; when `tied`, stages from `tie_from` on share one module (upstream's
    `[module] * n`: every stage's key names the same tensor)."""
    if not tied:
        return nn.ModuleList(make(i) for i in range(n_predict))
    shared = make(tie_from)
    return nn.ModuleList([make(i) for i in range(tie_from)] + [shared] * (n_predict - tie_from))
