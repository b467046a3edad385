"""Medusa checkpoints: this project's, FasterDecoding's Medusa-1 and Medusa-2, and NVIDIA ModelOpt's; strictly."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import load_saved_heads
from methods.medusa.heads import MedusaHeads

TRAIN_COMMAND = "python -m bench.train method=medusa"
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train heads "
                f"with: {TRAIN_COMMAND}")
HEAD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # Medusa-1
FULL_MODEL_PREFIX = "medusa_head."  # Medusa-2: the heads' keys inside the full model's state dict
FULL_MODEL_WEIGHTS = (("model.safetensors.index.json", "model.safetensors"),
                      ("pytorch_model.bin.index.json", "pytorch_model.bin"))
MODELOPT_FILES = ("modelopt_medusa.pth", "modelopt_state.pth")


def load_medusa(checkpoint: str | Path, target) -> tuple[MedusaHeads, DraftVocabulary, str]:
    """(heads, vocabulary, fingerprint) from a checkpoint folder in any supported format, on the target's device
    and dtype."""
    folder = checkpoint_folder(checkpoint, "Medusa")
    lm_head = target.get_output_embeddings()
    if folder.is_file() or any((folder / f).exists() for f in MODELOPT_FILES):
        # NVIDIA ModelOpt: an mto.save file (train.backend=modelopt names it modelopt_medusa.pth), or a
        # save_pretrained folder with ModelOpt's modelopt_state.pth beside the weights
        from methods.medusa.modelopt import load_modelopt_medusa

        heads, vocab = load_modelopt_medusa(folder, target)
        return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    if "medusa_num_heads" in config:  # FasterDecoding's layouts: per-head private projections
        source, state = _upstream_state(folder)
        vocab_size, hidden_size = lm_head.weight.shape
        heads = _upstream_heads(source, state, config, hidden_size, vocab_size)
        vocab = DraftVocabulary(lm_head)
    else:
        heads, vocab = load_saved_heads(folder, "medusa", lambda config: MedusaHeads(
            lm_head.weight.shape[1], config["num_heads"], config["num_layers"]), lm_head, TRAIN_COMMAND)
    return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _upstream_state(folder: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """(what to call the source in errors, head tensors in the `{head}.{layer}...` layout): Medusa-1's head file, else
    the `medusa_head.*` tensors of Medusa-2's full-model weights (one file, or the shards its index lists)."""
    for name in HEAD_FILES:
        if (folder / name).exists():
            return str(folder / name), read_tensors(folder / name, UPSTREAM_FIX)
    for index_name, single in FULL_MODEL_WEIGHTS:
        if (folder / index_name).exists():
            weight_map = read_json(folder / index_name, UPSTREAM_FIX).get("weight_map", {})
            files = sorted({folder / shard for key, shard in weight_map.items() if key.startswith(FULL_MODEL_PREFIX)})
            break
        if (folder / single).exists():
            files = [folder / single]
            break
    else:
        raise MissingArtifactError(f"{folder} has a Medusa config.json but neither medusa_lm_head.pt (Medusa-1) nor "
                                   f"model weights (Medusa-2); {UPSTREAM_FIX}")
    state = {}
    for file in files:
        state.update(read_tensors(file, UPSTREAM_FIX, prefix=FULL_MODEL_PREFIX))
    if not state:
        raise InvalidArtifactError(f"{folder} has a Medusa config.json but its model weights hold no "
                                   f"{FULL_MODEL_PREFIX}* tensors; {UPSTREAM_FIX}")
    return f"{folder} ({FULL_MODEL_PREFIX}* tensors)", state


UPSTREAM_KEY = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")


def _upstream_heads(source: str, state: dict[str, torch.Tensor], config: dict, hidden_size: int,
                    vocab_size: int) -> MedusaHeads:
    """MedusaHeads shaped by the tensors (heads: 1 + the highest head index; layers: the projection's position),
    loaded strictly; a config.json that says otherwise is warned about once."""
    parsed = [m.groups() for m in map(UPSTREAM_KEY.fullmatch, state) if m]
    if not parsed:
        raise InvalidArtifactError(f"{source} holds no Medusa head tensors ({{head}}.{{layer}}.linear.weight, ...); "
                                   f"{UPSTREAM_FIX}")
    num_heads = 1 + max(int(head) for head, _, _ in parsed)
    projections = [int(position) for _, position, name in parsed if name == "weight"]
    num_layers = max(projections) if projections else 1 + max(int(position) for _, position, _ in parsed)
    declared = config.get("medusa_num_heads"), config.get("medusa_num_layers", 1)
    if declared != (num_heads, num_layers):
        warnings.warn(f"{source}: config.json declares {declared[0]} Medusa heads of {declared[1]} layer(s), the "
                      f"weights hold {num_heads} of {num_layers}; using the weights' counts", stacklevel=3)
    heads = MedusaHeads(hidden_size, num_heads, num_layers, private_vocab_size=vocab_size)
    load_strictly(heads, state, source, UPSTREAM_FIX, file_key=lambda key: _upstream_key(key, num_layers),
                  dropped=lambda name: _is_earlier_block_copy(name, num_layers))
    return heads


def _upstream_key(key: str, num_layers: int) -> str:
    """MedusaHeads key -> FasterDecoding's: `blocks.{h}.{l}.linear.*` -> `{h}.{num_layers - 1}.linear.*` (the last
    stored copy of the head's one shared ResBlock), `projections.{h}.weight` -> `{h}.{num_layers}.weight`."""
    kind, head, rest = key.split(".", 2)
    if kind == "projections":
        return f"{head}.{num_layers}.{rest}"
    return f"{head}.{num_layers - 1}.{rest.split('.', 1)[1]}"


def _is_earlier_block_copy(name: str, num_layers: int) -> bool:
    """`{h}.{l}.linear.*` with l < num_layers - 1: a copy of the shared ResBlock that upstream's loading overwrites."""
    match = UPSTREAM_KEY.fullmatch(name)
    return bool(match) and match.group(3) != "weight" and int(match.group(2)) < num_layers - 1
