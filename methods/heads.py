"""Pieces shared by the methods that draft from the target's hidden states (Medusa, EAGLE, Hydra).

- `DraftVocabulary`: logits over the target's own LM head, or over a frequency-ranked slice of its rows (FR-Spec
  style). The slice adds no parameters and stays lossless: the target verifies every draft, and under sampling the
  draft's distribution is simply zero outside the slice.
- `ResBlock`: Medusa's residual block, x + SiLU(Linear(x)), zero-initialised so an untrained block is the identity.
- `save_heads` / `read_heads`: a checkpoint folder (config.json, fp16 model.safetensors, card.json).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bench.models import MissingArtifactError, resolve_artifact_path


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised (the identity until trained)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def most_frequent_tokens(labels: torch.Tensor, size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `size` token ids most frequent in `labels` (the target's own predictions on the training corpus), the
    `always` ids (special tokens) included; sorted ascending. [size] int64."""
    counts = torch.bincount(labels.flatten(), minlength=vocab_size).float()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    return counts.topk(min(size, vocab_size)).indices.sort().values


class DraftVocabulary(nn.Module):
    """Draft logits through the target's LM head, restricted to `token_ids` when given (None: full vocabulary).

    The sliced weight is a frozen copy ([V', H]); `to_token_ids` maps slice positions back to vocabulary ids and
    `slice_positions` maps vocabulary ids into the slice (-100 outside it, for cross-entropy's ignore_index).
    """

    def __init__(self, lm_head: nn.Linear, token_ids: torch.Tensor | None = None):
        super().__init__()
        weight, bias = lm_head.weight.detach(), getattr(lm_head, "bias", None)
        vocab_size = weight.shape[0]
        if token_ids is not None:
            token_ids = token_ids.to(weight.device)
            weight = weight[token_ids].clone()
            bias = None if bias is None else bias.detach()[token_ids].clone()
            position = torch.full((vocab_size,), -100, dtype=torch.long, device=weight.device)
            position[token_ids] = torch.arange(len(token_ids), device=weight.device)
            self.register_buffer("position", position, persistent=False)
        self.register_buffer("weight", weight, persistent=False)  # [V', H]
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)
        self.register_buffer("token_ids", token_ids, persistent=False)
        self.vocab_size = vocab_size

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V'] logits."""
        return nn.functional.linear(hidden, self.weight.to(hidden.dtype),
                                    None if self.bias is None else self.bias.to(hidden.dtype))

    def to_token_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions if self.token_ids is None else self.token_ids[positions]

    def slice_positions(self, token_ids: torch.Tensor) -> torch.Tensor:
        return token_ids if self.token_ids is None else self.position[token_ids]

    def full_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V'] probabilities over the slice -> [..., vocab], zero outside the slice."""
        if self.token_ids is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return full.index_copy_(-1, self.token_ids, probs)


def checkpoint_folder(checkpoint: str | Path, method: str) -> Path:
    """A checkpoint's local folder: a path (relative to the project root), else a hub id fetched into the HF cache
    (one line saying how to get it when that fails, e.g. offline)."""
    folder = resolve_artifact_path(checkpoint)
    if folder is not None:
        return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(checkpoint)))
    except Exception as err:  # offline, unknown id, no access
        raise MissingArtifactError(f"{method} checkpoint '{checkpoint}' cannot be fetched ({type(err).__name__}); "
                                   f"download it (huggingface-cli download {checkpoint}) and pass its folder") from err


class LastFeatureDrafter:
    """Base of the drafters that draft from the target's feature at the last accepted token (Medusa, Hydra)."""

    feature_layers = (-1,)
    hidden: torch.Tensor | None = None  # [H]

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.hidden = hidden[-1]

    def update(self, step) -> None:
        self.hidden = step.hidden[step.acceptance.rows[-1]]


def heads_or_checkpoint(module, vocab, checkpoint, target, load) -> tuple:
    """(module, vocabulary, artifact fingerprint): the module passed in (tests, notebooks; no fingerprint), else
    `load(checkpoint, target)`."""
    if module is None:
        return load(checkpoint, target)
    return module, vocab or DraftVocabulary(target.get_output_embeddings()), None


def save_heads(out_dir: Path, config: dict, state: dict[str, torch.Tensor], card: dict) -> None:
    """config.json, model.safetensors (floating tensors stored as fp16) and card.json in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach()).contiguous().cpu()
               for k, v in state.items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")


def read_heads(folder: Path, method: str, train_command: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) of a checkpoint written by save_heads for `method`; a clear error when it is missing."""
    if not (folder / "config.json").exists():
        raise MissingArtifactError(f"{method} checkpoint not found at {folder}; make it with: {train_command}")
    config = json.loads((folder / "config.json").read_text())
    if config.get("specbench_method") != method:
        raise MissingArtifactError(f"{folder} holds no {method} checkpoint of this project (config.json says "
                                   f"{config.get('specbench_method')!r}); make one with: {train_command}")
    return config, load_file(folder / "model.safetensors")
