"""Hydra (Ankner et al. 2024): Medusa heads made sequentially dependent.

Head k (0-based) guesses the token k + 2 places ahead, like Medusa's, but it also sees the embeddings of the tokens
before it on its tree path: its input is concat(h_t, e(root), e(x_1), ..., e(x_k)), (k + 2) x H wide, where h_t is
the target's feature at the last accepted token and x_1..x_k the draft tokens above it ("grounded" heads). A head
is a linear map of that input to H (initialised to pass h_t through), `num_layers` ResBlocks, then the target's LM
head (or its draft-vocabulary slice). The tree is Medusa's choices list, built level by level: one head call per
level for all the nodes whose children that level needs. Acceptance is the engine's lossless rule.

Hydra++ checkpoints as published (zankner/Hydra's `prefix-mlp` heads, e.g. ankner/hydra-vicuna-7b-v1.3) load as
`HydraPrefixHeads`: a one-decoder-layer "prefix" of the target's architecture (with its own norms and KV cache)
reads the target's features of the accepted context, and its output at the last one is the h_t the heads read;
head k is res(x) + SiLU(W x) on its (k + 2) x H input, then one ResBlock applied num_layers - 1 times (the same
block each time, as upstream builds it: its last stored copy is the one upstream's loading leaves), then the head's
own vocabulary projection (with a bias). Loading is strict: the only file keys dropped are the prefix's token
embedding (its inputs are features), the earlier copies of the shared block and rotary `inv_freq` buffers; anything
else missing, unexpected or mis-shaped, or an unreadable file, is refused in one line (InvalidArtifactError).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel

from bench.engine.kvcache import new_cache
from bench.errors import InvalidArtifactError, MissingArtifactError
from bench.artifacts import artifact_fingerprint
from bench.engine.tree import DraftTree
from methods.heads.common import (DraftVocabulary, one_layer_config, LastFeatureDrafter, ResBlock, checkpoint_folder,
                                  heads_or_checkpoint, load_strictly, read_heads, read_json, read_tensors)
from methods.heads.trees import static_tree

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
    """Training recipe for methods/heads/training.py."""

    method = "hydra"

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def build(self, target, tcfg) -> HydraHeads:
        return HydraHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: HydraHeads, vocab: DraftVocabulary, batch, target):
        return hydra_loss(module, vocab, target.get_input_embeddings(), batch, self.decay)

    def checkpoint_config(self, module: HydraHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}


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

    def logits(self, hidden: torch.Tensor, path_embeds: torch.Tensor, vocab: DraftVocabulary, head: int) -> torch.Tensor:
        x = self.first[head](torch.cat([hidden, path_embeds.flatten(-2)], dim=-1))
        for _ in range(self.repeats):
            x = self.repeated[head](x)
        return self.projections[head](x)


UPSTREAM_HEAD_FILE = "hydra_lm_head.pt"
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train heads "
                f"with: {TRAIN_COMMAND}")


def load_hydra(checkpoint: str | Path, target) -> tuple[HydraHeads | HydraPrefixHeads, DraftVocabulary, str]:
    """(heads, vocabulary, fingerprint) of a checkpoint made by `python -m bench.train method=hydra`, or of a
    published Hydra++ one (config.json with `hydra_head_arch: prefix-mlp` + hydra_lm_head.pt)."""
    folder = checkpoint_folder(checkpoint, "Hydra")
    upstream = read_json(folder / "config.json", UPSTREAM_FIX)
    lm_head = target.get_output_embeddings()
    if "hydra_head_arch" in upstream:
        heads = _load_upstream(folder, upstream, target)
        vocab = DraftVocabulary(lm_head)
    else:
        config, state = read_heads(folder, "hydra", TRAIN_COMMAND)
        heads = HydraHeads(lm_head.weight.shape[1], config["num_heads"], config["num_layers"])
        load_strictly(heads, {k: v for k, v in state.items() if k != "draft_vocab_ids"}, folder / "model.safetensors",
                      f"remake it with: {TRAIN_COMMAND}")
        vocab = DraftVocabulary(lm_head, state.get("draft_vocab_ids"))
    return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _load_upstream(folder: Path, config: dict, target) -> HydraPrefixHeads:
    arch, grounded = config["hydra_head_arch"], config.get("grounded_heads", False)
    if arch != "prefix-mlp" or not grounded or config.get("hidden_state_offset", 0):
        raise InvalidArtifactError(f"{folder}: Hydra head architecture {arch!r} (grounded_heads={grounded}, "
                                   f"hidden_state_offset={config.get('hidden_state_offset', 0)}) is not supported; "
                                   f"methods/hydra.py loads Hydra++ (prefix-mlp, grounded, offset 0) and its own "
                                   f"checkpoints ({TRAIN_COMMAND})")
    if not (folder / UPSTREAM_HEAD_FILE).exists():
        raise MissingArtifactError(f"{folder} has a Hydra config.json but no {UPSTREAM_HEAD_FILE}; download the whole "
                                   f"checkpoint folder (e.g. huggingface-cli download ankner/hydra-vicuna-7b-v1.3)")
    num_layers = config["hydra_num_layers"]
    heads = HydraPrefixHeads(target.config, target.get_output_embeddings().weight.shape[0], config["hydra_num_heads"],
                             num_layers)
    load_strictly(heads, read_tensors(folder / UPSTREAM_HEAD_FILE, UPSTREAM_FIX), folder / UPSTREAM_HEAD_FILE,
                  UPSTREAM_FIX, file_key=lambda key: _from_upstream_keys(key, num_layers),
                  provided={"prefix.embed_tokens.weight"}, dropped=lambda name: _dropped_upstream_key(name, num_layers))
    return heads


def _from_upstream_keys(key: str, num_layers: int) -> str:
    """HydraPrefixHeads key -> zankner/Hydra's: `prefix.*` -> `prefix_embeding_layer.*`, `first.{k}.*` ->
    `hydra_mlp.{k}.1.*`, `repeated.{k}.*` -> `hydra_mlp.{k}.{2 num_layers - 1}.*` (the shared block sits at 3, 5, ...;
    upstream's load_state_dict leaves the last copy in it), `projections.{k}.*` -> `hydra_lm_head.{k}.1.*`."""
    kind, rest = key.split(".", 1)
    if kind == "prefix":
        return f"prefix_embeding_layer.{rest}"
    head, rest = rest.split(".", 1)
    if kind == "projections":
        return f"hydra_lm_head.{head}.1.{rest}"
    return f"hydra_mlp.{head}.{1 if kind == 'first' else 2 * num_layers - 1}.{rest}"


def _dropped_upstream_key(name: str, num_layers: int) -> bool:
    """The prefix's token embedding (its inputs are features), earlier copies of the shared block, rotary buffers."""
    block = re.fullmatch(r"hydra_mlp\.\d+\.(\d+)\.linear\.(weight|bias)", name)
    return (name.startswith("prefix_embeding_layer.embed_tokens.") or name.endswith("rotary_emb.inv_freq")
            or bool(block) and 3 <= int(block.group(1)) < 2 * num_layers - 1)


class HydraDrafter(LastFeatureDrafter):
    """Builds the static choices tree level by level; level d's tokens come from head d-1 reading each parent's path.
    With Hydra++ heads, h_t is the prefix layer's output, its cache fed the target's features of the accepted rows."""

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

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        if isinstance(self.heads, HydraPrefixHeads):
            self.prefix_cache = new_cache()
            hidden = self.heads.prefix_features(hidden, self.prefix_cache)
        super().start(prompt_ids, hidden)

    @torch.inference_mode()
    def update(self, step) -> None:
        if isinstance(self.heads, HydraPrefixHeads):
            self.hidden = self.heads.prefix_features(step.hidden[step.acceptance.rows], self.prefix_cache)[-1]
        else:
            super().update(step)

    def _path(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.template.parents[node]
        return path[::-1]

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        if max_tokens <= 1:
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
