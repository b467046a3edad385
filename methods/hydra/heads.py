"""Hydra's heads: this project's (`HydraHeads`) and Hydra++'s published `prefix-mlp` layout (`HydraPrefixHeads`)."""
from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModel

from methods.heads.common import DraftVocabulary, ResBlock, one_layer_config


class HydraHeads(nn.Module):
    """K sequentially dependent heads; head k reads (k + 2) x H inputs."""

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.inputs = nn.ModuleList(nn.Linear((k + 2) * hidden_size, hidden_size) for k in range(num_heads))
        for layer in self.inputs:  # start as Medusa's untrained head: h_t passed through
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
            with torch.no_grad():
                layer.weight[:, :hidden_size] = torch.eye(hidden_size)
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))
                                    for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def logits(self, hidden: torch.Tensor, path_embeds: torch.Tensor, vocab: DraftVocabulary,
               head: int) -> torch.Tensor:
        """hidden [..., H], path_embeds [..., head + 1, H] (root first) -> [..., V'] logits of head `head`."""
        x = torch.cat([hidden, path_embeds.flatten(-2)], dim=-1)
        return vocab(self.blocks[head](self.inputs[head](x)))


class GroundedBlock(nn.Module):
    """Hydra++'s first block of head k: res(x) + SiLU(W x), both maps (k + 2) x H -> H."""

    def __init__(self, in_features: int, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(in_features, hidden_size)
        self.res_connection = nn.Linear(in_features, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res_connection(x) + nn.functional.silu(self.linear(x))


class HydraPrefixHeads(nn.Module):
    """Hydra++ heads (the published `prefix-mlp` layout): a one-layer prefix over the target's features, K grounded
    heads with their own vocabulary projections. `logits` has HydraHeads' signature; the vocabulary is the full one."""

    def __init__(self, target_config, vocab_size: int, num_heads: int, num_layers: int):
        super().__init__()
        hidden = target_config.hidden_size
        self.prefix = AutoModel.from_config(one_layer_config(target_config))  # rotary, masks, cache: HF's
        self.first = nn.ModuleList(GroundedBlock((k + 2) * hidden, hidden) for k in range(num_heads))
        self.repeats = num_layers - 1
        self.repeated = nn.ModuleList(ResBlock(hidden) for _ in range(num_heads if self.repeats else 0))
        self.projections = nn.ModuleList(nn.Linear(hidden, vocab_size) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.first)

    def prefix_features(self, features: torch.Tensor, cache) -> torch.Tensor:
        """The target's features [T, H] at the next T context positions -> the prefix's outputs [T, H] (cached)."""
        return self.prefix(inputs_embeds=features[None], cache=cache, use_cache=True).last_hidden_state[0]

    def logits(self, hidden: torch.Tensor, path_embeds: torch.Tensor, vocab: DraftVocabulary,
               head: int) -> torch.Tensor:
        x = self.first[head](torch.cat([hidden, path_embeds.flatten(-2)], dim=-1))
        for _ in range(self.repeats):
            x = self.repeated[head](x)
        return self.projections[head](x)
