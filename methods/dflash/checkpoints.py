"""DFlash checkpoints: the published layout (z-lab's `*-DFlash*` folders, the dflash package's DFlashDraftModel)
written and loaded strictly, and ours copied into it for the dflash package and vLLM (published_copy)."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from bench.artifacts import artifact_fingerprint, cache_dir
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.dflash.head import UPSTREAM_BLOCK_SIZE, DFlashDrafter, upstream_target_layer_ids
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import VOCABULARY_KEY

TRAIN_COMMAND = "python -m bench.train method=dflash"
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train one with: "
                f"{TRAIN_COMMAND}")
ARCHITECTURE = "DFlashDraftModel"
WEIGHT_FILE = "model.safetensors"
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
QWEN3_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_act", "rms_norm_eps", "max_position_embeddings", "num_hidden_layers", "attention_bias",
                "vocab_size", "rope_parameters", "rope_theta", "rope_scaling")


def published_config(target_config, num_layers: int, target_layer_ids: list[int], block_size: int,
                     mask_token_id: int) -> dict:
    """config.json of a drafter for a target of `target_config` in the published layout: a Qwen3 config of the
    target's widths (the drafter shares its embedding and LM head), `num_layers` layers, and the DFlash fields
    (block_size, num_target_layers, dflash_config's mask_token_id and target_layer_ids)."""
    heads = target_config.num_attention_heads
    rope = dict(getattr(target_config, "rope_parameters", None) or {})
    return {"architectures": [ARCHITECTURE], "model_type": "qwen3",
            "hidden_size": target_config.hidden_size, "intermediate_size": target_config.intermediate_size,
            "num_attention_heads": heads, "num_key_value_heads": target_config.num_key_value_heads or heads,
            "head_dim": getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
            "hidden_act": target_config.hidden_act, "rms_norm_eps": target_config.rms_norm_eps,
            "max_position_embeddings": target_config.max_position_embeddings, "num_hidden_layers": num_layers,
            "attention_bias": False, "vocab_size": target_config.vocab_size,
            "rope_theta": float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
            "tie_word_embeddings": False, "block_size": block_size,
            "num_target_layers": target_config.num_hidden_layers,
            "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)}}


def dflash_field(config: dict, name: str, default=None):
    """A DFlash field as the dflash package reads it: dflash_config's value, else the top-level one."""
    return (config.get("dflash_config") or {}).get(name, config.get(name, default))


def drafter_config(config: dict) -> tuple:
    """DFlashDrafter's arguments for a published config.json: the layers' Qwen3Config, target_layer_ids, block_size,
    mask_token_id, input_embedding_scale, output_multiplier, final_logit_softcapping."""
    qwen3 = Qwen3Config(**{k: v for k, v in config.items() if k in QWEN3_FIELDS})
    layer_ids = dflash_field(config, "target_layer_ids")
    if layer_ids is None:
        layer_ids = upstream_target_layer_ids(config["num_target_layers"], qwen3.num_hidden_layers)
    cap = dflash_field(config, "final_logit_softcapping")
    return (qwen3, list(layer_ids), int(dflash_field(config, "block_size", UPSTREAM_BLOCK_SIZE)),
            int(dflash_field(config, "mask_token_id")), float(dflash_field(config, "input_embedding_scale", 1.0)),
            float(dflash_field(config, "output_multiplier", 1.0)), float(cap) if cap and float(cap) > 0 else None)


def load_dflash(checkpoint: str | Path, target) -> tuple[DFlashDrafter, DraftVocabulary, str]:
    """(drafter, vocabulary, fingerprint) of a published DFlash folder (config.json with architectures
    [DFlashDraftModel]: z-lab's) or one made by `python -m bench.train method=dflash` (the same layout, with
    `specbench_method` and, for a draft-vocabulary slice, `draft_vocab_ids` beside the weights); on the target's
    device and dtype. A config for another target, another architecture or a tensor that does not fit is refused in
    one line."""
    folder = checkpoint_folder(checkpoint, "DFlash")
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    if not config:
        raise MissingArtifactError(f"DFlash checkpoint not found at {folder} (no config.json); {UPSTREAM_FIX}")
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise InvalidArtifactError(f"{folder}/config.json describes {architectures or 'no architecture'}, not a "
                                   f"{ARCHITECTURE}; methods/dflash/ loads DFlash drafters (DFlash2's dynamic "
                                   f"convolutions and candidate selector are not implemented)")
    drafter = DFlashDrafter(*drafter_config(_checked(folder, config, target)))
    file = folder / WEIGHT_FILE
    tensors = read_tensors(file, UPSTREAM_FIX)
    vocab_ids = tensors.pop(VOCABULARY_KEY, None)
    load_strictly(drafter, tensors, file, UPSTREAM_FIX)
    drafter = drafter.to(target.device, target.dtype).eval()
    return drafter, DraftVocabulary(target.get_output_embeddings(), vocab_ids), artifact_fingerprint(folder)


def published_copy(checkpoint: str | Path, out: Path | None = None) -> Path:
    """Our checkpoint as the dflash package and vLLM load it: config.json without `specbench_method`, the weights
    without the draft-vocabulary ids (so both draft over the whole vocabulary; vLLM refuses a tensor its drafter does
    not have). Written to `out`, else once into the cache, keyed by the checkpoint's fingerprint."""
    folder = Path(checkpoint)
    out = out or cache_dir() / "models" / f"{folder.name}-dflash-published-{artifact_fingerprint(folder)}"
    if (out / WEIGHT_FILE).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config.pop("specbench_method", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v for k, v in load_file(folder / WEIGHT_FILE).items() if k != VOCABULARY_KEY}
    save_file(tensors, out / WEIGHT_FILE)
    return out


def _checked(folder: Path, config: dict, target) -> dict:
    """`config`, once its fields are there and it drafts for `target` (widths, vocabulary, layers, mask token)."""
    missing = [name for name in REQUIRED_FIELDS if name not in config]
    missing += [f"dflash_config.{name}" for name in ("mask_token_id",) if dflash_field(config, name) is None]
    if dflash_field(config, "target_layer_ids") is None and "num_target_layers" not in config:
        missing.append("dflash_config.target_layer_ids (or num_target_layers)")
    if missing:
        raise InvalidArtifactError(f"{folder}/config.json lacks {', '.join(missing)}; {UPSTREAM_FIX}")
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []) \
            or config.get("is_causal"):
        raise InvalidArtifactError(f"{folder}/config.json has causal or sliding-window drafter layers; methods/dflash/ "
                                   f"implements the full-attention blocks of the DFlash drafters")
    vocab_size, hidden_size = target.get_output_embeddings().weight.shape
    layers = target.config.num_hidden_layers
    if (config["hidden_size"], config["vocab_size"]) != (hidden_size, vocab_size):
        raise InvalidArtifactError(f"{folder} drafts for a target of hidden size {config['hidden_size']} and "
                                   f"vocabulary {config['vocab_size']}, this target has {hidden_size} and "
                                   f"{vocab_size}; use the drafter published for this target")
    if config.get("num_target_layers", layers) != layers:
        raise InvalidArtifactError(f"{folder} drafts for a target of {config['num_target_layers']} layers, this one "
                                   f"has {layers}; use the drafter published for this target")
    layer_ids = dflash_field(config, "target_layer_ids") or []
    if any(not 0 <= layer < layers for layer in layer_ids):
        raise InvalidArtifactError(f"{folder}: target_layer_ids {layer_ids} outside this target's layers "
                                   f"0..{layers - 1}")
    if not 0 <= int(dflash_field(config, "mask_token_id")) < vocab_size:
        raise InvalidArtifactError(f"{folder}: mask_token_id {dflash_field(config, 'mask_token_id')} outside the "
                                   f"target's vocabulary of {vocab_size}")
    return config
