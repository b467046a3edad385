"""ReDrafter's recurrent drafter: the published layout (its own vocabulary-sized LM head) and this project's
CPU-sized one (a projection into the target's LM head or its draft-vocabulary slice)."""
from __future__ import annotations

import torch
from torch import nn

from methods.heads.common import DraftVocabulary, ResBlock


class RecurrentDrafterHead(nn.Module):
    """The recurrence both layouts share (Cheng et al. 2024, arXiv 2403.09919, eq. 1-2; apple/ml-recurrent-drafter's
    `Drafter`). With h the target's last hidden state at the last accepted token and e(y) the target's embedding of a
    token y, the state starts at s_0 = 0 and advances on each drafted token (the first one: the token the target
    itself chose after h):

        s_k = SiLU(W e(y_k) + U s_{k-1} + b)    (rnn: true; rnn: false is s_k = s_{k-1} + e(y_k))

    and the next token's logits are lm_head(input_proj([h, s_k])): `num_draft_layers` ResBlocks x + SiLU(A x + a) of
    width `exit_dim` and a final projection (input_proj only when exit_dim != 2 hidden_size). Module names are
    upstream's (`rnn_u` = U with b, `rnn_w` = W, `input_proj`, `lm_head.{i}`), so the published tensors load by name.
    Subclasses give the final projection and `logits(...)`.
    """

    def __init__(self, hidden_size: int, exit_dim: int, num_draft_layers: int, rnn: bool, out_features: int):
        super().__init__()
        self.hidden_size, self.exit_dim, self.num_draft_layers, self.rnn = hidden_size, exit_dim, num_draft_layers, rnn
        if exit_dim != 2 * hidden_size:
            self.input_proj = nn.Linear(2 * hidden_size, exit_dim)
        self.lm_head = nn.Sequential(*(ResBlock(exit_dim) for _ in range(num_draft_layers)),
                                     nn.Linear(exit_dim, out_features, bias=False))
        if rnn:
            self.rnn_u = nn.Linear(hidden_size, hidden_size)
            self.rnn_w = nn.Linear(hidden_size, hidden_size, bias=False)
        self.register_buffer("target_embedding", None, persistent=False)

    def attach_embedding(self, embedding: nn.Embedding) -> RecurrentDrafterHead:
        """Read the target's token embedding table (frozen, not saved with the weights: upstream's drafter has none)."""
        self.target_embedding = embedding.weight.detach()
        return self

    def advance(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """s_k from s_{k-1} ([..., H]) and the tokens y_k ([...])."""
        embedded = self.target_embedding[tokens].to(state.dtype)
        if not self.rnn:
            return state + embedded
        return nn.functional.silu(self.rnn_w(embedded) + self.rnn_u(state))

    def features(self, context: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """lm_head's input after its ResBlocks, before the final projection: [..., exit_dim]."""
        x = torch.cat([context.to(state.dtype), state], dim=-1)
        x = self.input_proj(x) if hasattr(self, "input_proj") else x
        return self.lm_head[:-1](x)

    def logits(self, context: torch.Tensor, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        raise NotImplementedError


class PublishedRecurrentDrafter(RecurrentDrafterHead):
    """Upstream's layout: the final projection is a [vocab_size, exit_dim] LM head of its own (no bias)."""

    def __init__(self, hidden_size: int, exit_dim: int, num_draft_layers: int, rnn: bool, vocab_size: int):
        super().__init__(hidden_size, exit_dim, num_draft_layers, rnn, vocab_size)

    def logits(self, context: torch.Tensor, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        """Full-vocabulary logits (the vocabulary passed in is the target's whole one)."""
        return self.lm_head[-1](self.features(context, state))


class SharedVocabRecurrentDrafter(RecurrentDrafterHead):
    """This project's CPU-sized layout: the final projection maps exit_dim to the target's hidden size and scores
    through the target's own LM head (or its draft-vocabulary slice) instead of a [vocab, exit_dim] table of its own
    (57M parameters for SmolLM2). With exit_dim = 2 hidden_size it starts as [h, s] -> h: the target's own head on h."""

    def __init__(self, hidden_size: int, num_draft_layers: int, rnn: bool = True, exit_dim: int | None = None):
        super().__init__(hidden_size, exit_dim or 2 * hidden_size, num_draft_layers, rnn, hidden_size)
        if self.exit_dim == 2 * hidden_size:
            with torch.no_grad():
                out = self.lm_head[-1].weight
                out.zero_()
                out[:, :hidden_size] = torch.eye(hidden_size)

    def logits(self, context: torch.Tensor, state: torch.Tensor, vocab: DraftVocabulary) -> torch.Tensor:
        return vocab(self.lm_head[-1](self.features(context, state)))
