"""EAGLE's head: one decoder layer of the target's own architecture over (token embedding, target feature) pairs."""
from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModel, DynamicCache

from methods.heads.common import one_layer_config


class EagleHead(nn.Module):
    """fc(concat(embedding, feature)) -> one decoder layer -> predicted next feature."""

    def __init__(self, target_config, bias: bool = True):
        super().__init__()
        hidden = target_config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        self.body = AutoModel.from_config(one_layer_config(target_config))  # rotary embeddings, masks, cache: HF's
        self.body.norm = nn.Identity()  # EAGLE has no final norm
        layer = self.body.layers[0]
        if hasattr(layer, "input_layernorm"):  # EAGLE skips the first layer's input norm: features are normed
            layer.input_layernorm = nn.Identity()

    @property
    def config(self):
        """The config of the head's decoder layer (what a cache of its own is made for)."""
        return self.body.config

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache: DynamicCache | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds, features: [B, T, H] -> [B, T, H] predicted features (of the next position)."""
        inputs = self.fc(torch.cat([embeds, features], dim=-1))
        return self.body(inputs_embeds=inputs, cache=cache, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=cache is not None).last_hidden_state
