"""DFlash's drafter module (the published `DFlashDraftModel` layout: its parameter names and config.json fields).

Equations (arXiv 2602.06036, section 3; one denoising step, as upstream drafts):
- context: c = hidden_norm(fc([h_l1; h_l2; ...])) for every context position, the target's hidden states after its
  layers `target_layer_ids` concatenated (transformers' hidden_states[l + 1]);
- block: x_0 = E[anchor, mask, ..., mask] (the target's frozen embedding of the last accepted token and block_size-1
  mask tokens), at positions p, p+1, ..., p+block_size-1 after the context;
- each drafter layer i: u = input_layernorm(x); q = q_norm(W_q u); k = k_norm(W_k [c; u]); v = W_v [c; u] (the same
  context c projected by every layer); rotary positions on q and k; attention of the block rows over the context and
  the whole block (bidirectional within the block, no causal mask); x += W_o attn;
  x += mlp(post_attention_layernorm(x));
- out = norm(x); the target's LM head turns rows 1..block_size-1 into the drafts of the next block_size-1 tokens.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

UPSTREAM_BLOCK_SIZE = 16  # the dflash package's default (DFlashDraftModel.block_size), z-lab's *-b16 checkpoints


def upstream_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The target layers a drafter of `num_draft_layers` layers reads by default (the dflash package's rule): the
    middle one for a single layer, else `num_draft_layers` spread evenly from layer 1 to layer L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, T, d] at cos/sin [B, T, d]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    """Attention of the block rows over [context; block]: q from the block, k / v from both (Qwen3's per-head
    q_norm / k_norm)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = bool(config.attention_bias)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.groups = heads // kv_heads

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, n * d] -> [B, n, T, d]."""
        return x.view(*x.shape[:2], -1, self.head_dim).transpose(1, 2)

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys (normed, rotated) and values of context rows [B, C, h] at their positions' cos / sin."""
        return rotate(self.k_norm(self.heads(self.k_proj(context))), cos, sin), self.heads(self.v_proj(context))

    def forward(self, block: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """block [B, Q, h] (normed), past: the context's keys / values [B, kv, C, d]; cos / sin [B, Q, d] at the
        block's positions; attention_mask bool [B, 1, Q, C + Q] (True: attend) or None (everything)."""
        q = rotate(self.q_norm(self.heads(self.q_proj(block))), cos, sin)
        k_block, v_block = self.context_kv(block, cos, sin)
        k = torch.cat([past[0], k_block], dim=2).repeat_interleave(self.groups, dim=1)
        v = torch.cat([past[1], v_block], dim=2).repeat_interleave(self.groups, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.o_proj(out.transpose(1, 2).reshape(*block.shape[:2], -1))


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose attention also reads the context's keys and values."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, past, cos, sin, attention_mask):
        x = x + self.self_attn(self.input_layernorm(x), past, cos, sin, attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """fc + hidden_norm over the target's concatenated layers, `num_hidden_layers` DFlashLayers, final norm. The
    embedding and LM head are the target's (not part of the module)."""

    def __init__(self, config: Qwen3Config, target_layer_ids: list[int], block_size: int, mask_token_id: int,
                 input_embedding_scale: float = 1.0, output_multiplier: float = 1.0,
                 final_logit_softcapping: float | None = None):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.target_layer_ids = list(target_layer_ids)
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        # the dflash package's optional config fields (1, 1, none by default): the block's embedding scaled, the
        # logits multiplied, then soft-capped (tanh(l / cap) x cap)
        self.input_embedding_scale, self.output_multiplier = input_embedding_scale, output_multiplier
        self.final_logit_softcapping = final_logit_softcapping

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """transformers' hidden_states indices of the target features: layer l's output is hidden_states[l + 1]."""
        return tuple(layer + 1 for layer in self.target_layer_ids)

    def context_cache(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, the keys / values of context rows: features [B, C, len(layers) x h_target] (the target's),
        positions [B, C]."""
        context = self.hidden_norm(self.fc(features))
        cos, sin = self.rotary_emb(context, positions)
        return [layer.self_attn.context_kv(context, cos, sin) for layer in self.layers]

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The LM head's logits as the checkpoint's config wants them (output_multiplier, final_logit_softcapping)."""
        logits = logits * self.output_multiplier if self.output_multiplier != 1.0 else logits
        cap = self.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def forward(self, block: torch.Tensor, positions: torch.Tensor, past: list[tuple[torch.Tensor, ...]],
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """block [B, Q, h]: the embedded anchor / mask rows at `positions` [B, Q]; past: `context_cache`'s keys /
        values -> norm(x) [B, Q, h]."""
        cos, sin = self.rotary_emb(block, positions)
        x = block
        for layer, kv in zip(self.layers, past, strict=True):
            x = layer(x, kv, cos, sin, attention_mask)
        return self.norm(x)
