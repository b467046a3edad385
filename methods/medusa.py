"""Medusa-1 (Cai et al. 2024): K heads on the target's last hidden state draft a static token tree.

Head k (0-based) maps the target's post-norm hidden state h_t at the last accepted token to a guess of the token
k + 2 places ahead (the target's own LM head gives the next one, the tree's root). Each head is `num_layers`
ResBlocks followed by a vocabulary projection: by default the target's own LM head (Medusa's later "shared head"
choice, optionally a frequency-ranked slice of it), or one private projection per head as in the published
checkpoints. The candidates form a sparse tree given as a choices list (`[[0], [0, 0], [1], ...]`: a path of
top-k ranks, one per head), verified by the engine in one forward with tree attention; greedy and sampled
acceptance are the engine's lossless rules (the tree's siblings are deterministic proposals).

Checkpoints load from three formats: this project's (`python -m bench.train method=medusa`), the upstream one
(FasterDecoding's `config.json` with `medusa_num_heads` + `medusa_lm_head.pt`), and NVIDIA ModelOpt's
(`mto.save` of a model converted with `mtsp.convert(model, [("medusa", ...)])`, see methods/modelopt.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from bench.models import MissingArtifactError, artifact_fingerprint
from bench.tree import DeviceTokens, DraftTree
from methods.heads import (DraftVocabulary, LastFeatureDrafter, ResBlock, checkpoint_folder, heads_or_checkpoint,
                           read_heads)
from methods.trees import resolve_choices

TRAIN_COMMAND = "python -m bench.train method=medusa"


class MedusaHeads(nn.Module):
    """K Medusa heads. `private_vocab_size` gives each head its own projection (upstream layout); else the heads
    return hidden states and the caller projects them through a shared DraftVocabulary."""

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1, private_vocab_size: int | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))
                                    for _ in range(num_heads))
        self.projections = None if private_vocab_size is None else nn.ModuleList(
            nn.Linear(hidden_size, private_vocab_size, bias=False) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def logits(self, hidden: torch.Tensor, vocab: DraftVocabulary, head: int) -> torch.Tensor:
        """[..., H] target features -> [..., V'] logits of one head."""
        out = self.blocks[head](hidden)
        return vocab(out) if self.projections is None else self.projections[head](out)


def medusa_loss(heads: MedusaHeads, vocab: DraftVocabulary, hidden: torch.Tensor, labels: torch.Tensor,
                mask: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum over heads of decay^k x cross-entropy against the target's own predictions.

    hidden [B, S, H] (features at t), labels [B, S] (the target's argmax at t: its next token), mask [B, S].
    Head k at t is trained on labels[t + k + 1]. Returns (loss, per-head logits at the masked positions' labels
    as (logits [N, V'], targets [N]) pairs for metrics).
    """
    total, outputs = hidden.new_zeros(()), []
    for k in range(heads.num_heads):
        shift = k + 1
        keep = mask[:, shift:]
        h = hidden[:, :-shift][keep]  # [N, H]
        targets = vocab.slice_positions(labels[:, shift:][keep])  # [N]
        logits = heads.logits(h, vocab, k)
        total = total + decay ** k * nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100)
        outputs.append((logits.detach(), targets))
    return total, outputs


def tree_from_choices(choices: list[list[int]]) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """A static tree from Medusa choices: (template tree with placeholder tokens, head of each node [n], top-k rank
    of each node [n]). Node order: by depth, then lexicographic, so parents come before children."""
    paths = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))
    index = {path: i for i, path in enumerate(paths)}
    parents = []
    for path in paths:
        if len(path) > 1 and path[:-1] not in index:
            raise ValueError(f"Medusa choice {list(path)} has no parent {list(path[:-1])} in the choices list")
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
    template = DraftTree([0] * len(paths), parents)
    heads = torch.tensor([len(p) - 1 for p in paths])
    ranks = torch.tensor([p[-1] for p in paths])
    return template, heads, ranks


def static_tree(choices, tree_size: int | None, num_heads: int, method: str):
    """tree_from_choices of the first `tree_size` choices (a name in methods/trees.py or a list; default: one chain as
    deep as the heads), refused when deeper than the checkpoint's `num_heads`."""
    choices = (resolve_choices(choices) or [[0] * d for d in range(1, num_heads + 1)])[:tree_size]
    template, node_heads, node_ranks = tree_from_choices(choices)
    if int(node_heads.max()) >= num_heads:
        raise ValueError(f"the {method} tree is {int(node_heads.max()) + 1} deep but the checkpoint has {num_heads} "
                         f"heads; use a shallower method.drafter.choices")
    return template, node_heads, node_ranks


def load_medusa(checkpoint: str | Path, target) -> tuple[MedusaHeads, DraftVocabulary, str]:
    """(heads, vocabulary, fingerprint) from a checkpoint folder in any supported format, on the target's device
    and dtype."""
    folder = checkpoint_folder(checkpoint, "Medusa")
    lm_head = target.get_output_embeddings()
    hidden_size = lm_head.weight.shape[1]
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if "medusa_num_heads" in config:  # FasterDecoding's layout: per-head private projections
        state = _upstream_state(folder)
        heads = MedusaHeads(hidden_size, config["medusa_num_heads"], config.get("medusa_num_layers", 1),
                            private_vocab_size=lm_head.weight.shape[0])
        heads.load_state_dict(_from_upstream_keys(state, config.get("medusa_num_layers", 1)))
        vocab = DraftVocabulary(lm_head)
    elif folder.is_file() or any((folder / f).exists() for f in ("modelopt_medusa.pth", "modelopt_state.pth")):
        # NVIDIA ModelOpt: an mto.save file (train.backend=modelopt names it modelopt_medusa.pth), or a
        # save_pretrained folder with ModelOpt's modelopt_state.pth beside the weights
        from methods.modelopt import load_modelopt_medusa

        heads, vocab = load_modelopt_medusa(folder, target)
    else:
        config, state = read_heads(folder, "medusa", TRAIN_COMMAND)
        heads = MedusaHeads(hidden_size, config["num_heads"], config["num_layers"])
        heads.load_state_dict({k: v for k, v in state.items() if k != "draft_vocab_ids"})
        vocab = DraftVocabulary(lm_head, state.get("draft_vocab_ids"))
    return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _upstream_state(folder: Path) -> dict[str, torch.Tensor]:
    for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt"):
        if (folder / name).exists():
            if name.endswith(".pt"):
                return torch.load(folder / name, map_location="cpu", weights_only=True)
            from safetensors.torch import load_file

            return load_file(folder / name)
    raise MissingArtifactError(f"{folder} has a Medusa config.json but no medusa_lm_head.pt; download the whole "
                               f"checkpoint folder (e.g. huggingface-cli download FasterDecoding/medusa-vicuna-7b-v1.3)")


def _from_upstream_keys(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """FasterDecoding keys `{head}.{layer}.linear.*` and `{head}.{num_layers}.weight` -> MedusaHeads keys."""
    mapped = {}
    for key, value in state.items():
        head, position, rest = key.split(".", 2)
        if int(position) == num_layers:
            mapped[f"projections.{head}.{rest}"] = value
        else:
            mapped[f"blocks.{head}.{position}.{rest}"] = value
    return mapped


class MedusaDrafter(LastFeatureDrafter):
    """Proposes Medusa's static tree: node (head k, rank r) is head k's r-th most likely token."""


    def __init__(self, target, tokenizer=None, checkpoint: str = "", choices: str | list[list[int]] | None = None,
                 tree_size: int | None = None, heads: MedusaHeads | None = None, vocab: DraftVocabulary | None = None):
        self.heads, self.vocab, self.artifact = heads_or_checkpoint(heads, vocab, checkpoint, target, load_medusa)
        self.template, node_heads, node_ranks = static_tree(choices, tree_size, self.heads.num_heads, "Medusa")
        self.num_used_heads = int(node_heads.max()) + 1
        self.top_k = int(node_ranks.max()) + 1
        device = target.device
        self.node_heads, self.node_ranks = node_heads.to(device), node_ranks.to(device)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        """The static tree with this step's candidates, left on the device: the engine reads them back with its
        acceptance copy, so drafting makes no host sync."""
        if budget <= 1:
            return None
        candidates = torch.stack([self.heads.logits(self.hidden, self.vocab, k).topk(self.top_k).indices
                                  for k in range(self.num_used_heads)])  # [heads, top_k]
        tokens = self.vocab.to_token_ids(candidates[self.node_heads, self.node_ranks])  # [n]
        return self.template.with_tokens(DeviceTokens(tokens))


class MedusaRecipe:
    """Training recipe for methods/training.py: `num_heads` heads of `num_layers` ResBlocks, projection shared with
    the target's LM head (or its draft-vocabulary slice), loss sum_k decay^k CE_k (Medusa-1)."""

    method = "medusa"

    def build(self, target, tcfg) -> MedusaHeads:
        return MedusaHeads(target.get_output_embeddings().weight.shape[1], tcfg.num_heads, tcfg.num_layers)

    def loss(self, module: MedusaHeads, vocab: DraftVocabulary, batch, target):
        return medusa_loss(module, vocab, batch.hidden, batch.labels, batch.mask, self.decay)

    def __init__(self, decay: float = 0.8):
        self.decay = decay

    def checkpoint_config(self, module: MedusaHeads, tcfg) -> dict:
        return {"num_heads": module.num_heads, "num_layers": len(module.blocks[0])}
