"""Hydra (Ankner et al. 2024): Medusa heads made sequentially dependent.

Head k (0-based) guesses the token k + 2 places ahead, like Medusa's, but it also sees the embeddings of the tokens
before it on its tree path: its input is concat(h_t, e(root), e(x_1), ..., e(x_k)), (k + 2) x H wide, where h_t is
the target's feature at the last accepted token and x_1..x_k the draft tokens above it ("grounded" heads). A head
is a linear map of that input to H (initialised to pass h_t through), `num_layers` ResBlocks, then the target's LM
head (or its draft-vocabulary slice). The tree is Medusa's choices list, built level by level: one head call per
level for all the nodes whose children that level needs. Acceptance is the engine's lossless rule.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bench.models import artifact_fingerprint
from bench.tree import DraftTree
from methods.heads import (DraftVocabulary, LastFeatureDrafter, ResBlock, checkpoint_folder, heads_or_checkpoint,
                           read_heads)
from methods.medusa import static_tree

TRAIN_COMMAND = "python -m bench.train method=hydra"


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

    def logits(self, hidden: torch.Tensor, path_embeds: torch.Tensor, vocab: DraftVocabulary, head: int) -> torch.Tensor:
        """hidden [..., H], path_embeds [..., head + 1, H] (root first) -> [..., V'] logits of head `head`."""
        x = torch.cat([hidden, path_embeds.flatten(-2)], dim=-1)
        return vocab(self.blocks[head](self.inputs[head](x)))


def hydra_loss(heads: HydraHeads, vocab: DraftVocabulary, embed: nn.Embedding, batch, decay: float = 0.8):
    """Sum over heads of decay^k x cross-entropy against the target's own predictions, teacher-forced on the
    corpus tokens: head k at t reads h_t and e(ids[t+1 .. t+k+1]) and is trained on labels[t+k+1]."""
    hidden, ids, labels, mask = batch.hidden, batch.input_ids, batch.labels, batch.mask
    with torch.no_grad():
        embeds = embed(ids)  # [B, S, H]
    total, outputs = hidden.new_zeros(()), []
    seq = hidden.shape[1]
    for k in range(heads.num_heads):
        span = seq - k - 1  # positions t with t + k + 1 < S
        keep = mask[:, k + 1 :]
        path = torch.stack([embeds[:, 1 + j : 1 + j + span] for j in range(k + 1)], dim=2)  # [B, span, k+1, H]
        logits = heads.logits(hidden[:, :span][keep], path[keep], vocab, k)
        targets = vocab.slice_positions(labels[:, k + 1 :][keep])
        total = total + decay ** k * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


class HydraRecipe:
    """Training recipe for methods/training.py."""

    method = "hydra"

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def build(self, target, tcfg) -> HydraHeads:
        return HydraHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: HydraHeads, vocab: DraftVocabulary, batch, target):
        return hydra_loss(module, vocab, target.get_input_embeddings(), batch, self.decay)

    def checkpoint_config(self, module: HydraHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}


def load_hydra(checkpoint: str | Path, target) -> tuple[HydraHeads, DraftVocabulary, str]:
    """(heads, vocabulary, fingerprint) of a checkpoint made by `python -m bench.train method=hydra`."""
    folder = checkpoint_folder(checkpoint, "Hydra")
    config, state = read_heads(folder, "hydra", TRAIN_COMMAND)
    heads = HydraHeads(target.get_output_embeddings().weight.shape[1], config["num_heads"], config["num_layers"])
    heads.load_state_dict({k: v for k, v in state.items() if k != "draft_vocab_ids"})
    vocab = DraftVocabulary(target.get_output_embeddings(), state.get("draft_vocab_ids"))
    return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


class HydraDrafter(LastFeatureDrafter):
    """Builds the static choices tree level by level; level d's tokens come from head d-1 reading each parent's path."""


    def __init__(self, target, tokenizer=None, checkpoint: str = "", choices: str | list[list[int]] | None = None,
                 tree_size: int | None = None, heads: HydraHeads | None = None, vocab: DraftVocabulary | None = None):
        self.heads, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target, load_hydra)
        self.embed = target.get_input_embeddings()
        self.template, node_heads, node_ranks = static_tree(choices, tree_size, self.heads.num_heads, "Hydra")
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

    def _path(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.template.parents[node]
        return path[::-1]

    @torch.inference_mode()
    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        if budget <= 1:
            return None
        root = self.embed(torch.tensor([context[-1]], device=self.hidden.device))  # [1, H]
        tokens = torch.zeros(len(self.template), dtype=torch.long, device=self.hidden.device)
        for head, (nodes, paths, parent_rows, ranks, top_k) in enumerate(self.levels):
            rows = paths.shape[0]
            path_embeds = torch.cat([root.expand(rows, 1, -1), self.embed(tokens[paths])], dim=1)  # [rows, head+1, H]
            logits = self.heads.logits(self.hidden.expand(rows, -1), path_embeds, self.vocab, head)
            candidates = self.vocab.to_token_ids(logits.topk(top_k, dim=-1).indices)  # [rows, top_k]
            tokens[nodes] = candidates[parent_rows, ranks]
        return self.template.with_tokens(tokens.tolist())
