"""EAGLE-3's head (SafeAILab/EAGLE `eagle/model/cnets.py`'s `Model`, with its parameter names) and draft vocabulary."""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

NOT_LAYER_FIELDS = ("architectures", "model_type", "torch_dtype", "dtype")  # not for LlamaConfig


def eagle3_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Indices into transformers' `hidden_states` of the features EAGLE-3 fuses: the inputs of decoder layers 2, L//2
    and L-3 (upstream's modeling_llama_kv.py collects `hidden_states` before running layer idx for those idx;
    `hidden_states[i]` is layer i's input). For a target of fewer than 7 layers (the tests' tiny models), where
    upstream's three would coincide, each index is clamped into 1..L-1 and may repeat."""
    return tuple(min(max(i, 1), max(num_layers - 1, 1)) for i in (2, num_layers // 2, num_layers - 3))


def layer_config(fields: dict, attn_implementation: str | None = None) -> LlamaConfig:
    """The Llama config of the head's decoder layer (upstream always builds a Llama layer, whatever the target):
    sizes, activation, norm epsilon and rotary settings from `fields`, head_dim = hidden / heads as upstream's."""
    config = LlamaConfig(**{k: v for k, v in fields.items() if k not in NOT_LAYER_FIELDS})
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.num_hidden_layers, config.attention_bias, config.mlp_bias = 1, False, False
    config._attn_implementation = attn_implementation or "sdpa"
    return config


class Eagle3Layer(nn.Module):
    """upstream's `LlamaDecoderLayeremb`: attention over [input_layernorm(embedding); hidden_norm(feature)], the
    feature (or, with `norm_before_residual`, its normed value: speculators' option) as the residual, then the MLP."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # project the 2h-wide [embedding; feature]
            out = getattr(self.self_attn, name).out_features
            setattr(self.self_attn, name, nn.Linear(2 * hidden, out, bias=False))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, features, position_embeddings, attention_mask, cache):
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        inputs = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attended, _ = self.self_attn(inputs, position_embeddings, attention_mask, cache=cache)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """fc -> midlayer -> (norm -> lm_head over the draft vocabulary); `d2t`, `t2d` the vocabulary maps. `forward`
    returns the midlayer's output (what is fed back for the next tree level); `logits` the draft-vocabulary logits.
    `embed_tokens` is the head's own embedding when its checkpoint carries one (else None: the target's is used)."""

    def __init__(self, config: LlamaConfig, target_hidden_size: int, target_vocab_size: int, draft_vocab_size: int,
                 feature_layers: tuple[int, ...], norm_before_residual: bool = False, own_embedding: bool = False):
        super().__init__()
        hidden = config.hidden_size
        self.config = config  # the decoder layer's (what a cache of its own is made for)
        self.embed_tokens = nn.Embedding(target_vocab_size, hidden) if own_embedding else None
        self.fc = nn.Linear(len(feature_layers) * target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3Layer(config, norm_before_residual)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)  # no state: its frequencies are recomputed from the config
        self.feature_layers = tuple(feature_layers)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache=None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [B, T, h]; features [B, T, 3 h_target] (the target's: fused by fc) or [B, T, h] (the head's own
        outputs) -> [B, T, h]. Without position_ids / attention_mask: the T rows follow the cache, causally."""
        if features.shape[-1] == self.fc.in_features:
            features = self.fc(features)
        past = 0 if cache is None else cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + features.shape[1], device=features.device)[None]
        if attention_mask is None:
            attention_mask = causal_mask(features.shape[1], past, features.dtype, features.device)
        elif attention_mask.dtype == torch.bool:  # True: attend (the training-time test's unrolled_mask)
            attention_mask = additive_mask(attention_mask, features.dtype)
        position_embeddings = self.rotary(features, position_ids)
        return self.midlayer(embeds.to(features.dtype), features, position_embeddings, attention_mask, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., h] -> [..., draft vocabulary] logits."""
        return self.lm_head(self.norm(hidden))

    def to_token_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids: d + d2t[d]."""
        return draft_ids + self.d2t[draft_ids]


def causal_mask(rows: int, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, rows, past + rows] additive mask: every row sees the `past` cached positions and the rows up to itself."""
    allowed = torch.ones(rows, past + rows, dtype=torch.bool, device=device).tril(past)
    return additive_mask(allowed, dtype)[None, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as an additive one in `dtype` (what eager attention adds to its scores)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


class Eagle3Vocabulary:
    """The head's draft vocabulary in the part of DraftVocabulary's interface (methods/heads/common.py) that
    EagleDrafter's dynamic tree uses: logits over the draft ids, their count, their target ids."""

    def __init__(self, head: Eagle3Head):
        self.head = head
        self.size = head.lm_head.out_features

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.logits(hidden)

    def to_token_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return self.head.to_token_ids(positions)

    def slice_positions(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids (-100 outside the draft vocabulary, for cross-entropy's ignore_index)."""
        t2d = self.head.t2d
        draft_ids = t2d.long().cumsum(0) - 1
        return torch.where(t2d[token_ids], draft_ids[token_ids], -100)

