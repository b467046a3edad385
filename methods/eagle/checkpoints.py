"""EAGLE-1/2 checkpoints: this project's (`python -m bench.train method=eagle`) and SafeAILab's (`EaModel`'s layout)."""
from __future__ import annotations

from pathlib import Path

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError
from methods.eagle.head import EagleHead
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import load_saved_heads

TRAIN_COMMAND = "python -m bench.train method=eagle"
UPSTREAM_WEIGHTS = ("pytorch_model.bin", "model.safetensors")  # in the order SafeAILab's EaModel tries them
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train a head "
                f"with: {TRAIN_COMMAND}")
# config.json fields of SafeAILab's head that shape its decoder layer (cnets1.py's LlamaDecoderLayer reads them from
# the head's own config, not the base model's); absent ones are the target's
UPSTREAM_LAYER_FIELDS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "hidden_act",
                         "rms_norm_eps", "max_position_embeddings")


def load_eagle(checkpoint: str | Path, target) -> tuple[EagleHead, DraftVocabulary, str]:
    """(head, vocabulary, fingerprint): this project's checkpoint, or SafeAILab's (config.json + pytorch_model.bin or
    model.safetensors with `fc.*` and `layers.0.*`, e.g. yuhuili/EAGLE-Vicuna-7B-v1.3), on the target's device and
    dtype.

    SafeAILab's head is built as EaModel builds it: `fc` with a bias unless config.json says `"bias": false` (the
    LLaMA-3 heads), the decoder layer's sizes, activation, norm epsilon and rotary base (`rope_theta`, else 10000;
    `rope_scaling`) from config.json. Loading is strict; the file keys deliberately dropped are `embed_tokens.weight`
    (the target's own embedding is used: upstream copies it from the base model and keeps it frozen),
    `layers.0.input_layernorm.weight` (EAGLE's first layer has no input norm; upstream never builds one) and
    `*.rotary_emb.inv_freq` (recomputed from the config). Anything else missing, unexpected or mis-shaped is refused
    in one line."""
    folder = checkpoint_folder(checkpoint, "EAGLE")
    lm_head = target.get_output_embeddings()
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    weights = next((folder / n for n in UPSTREAM_WEIGHTS if (folder / n).exists()), None)
    if weights is not None and config and "specbench_method" not in config:
        head = _upstream_head(folder, weights, config, target.config)
        vocab = DraftVocabulary(lm_head)
    else:
        head, vocab = load_saved_heads(folder, "eagle", lambda _: EagleHead(target.config), lm_head, TRAIN_COMMAND)
    return head.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _upstream_head(folder: Path, weights: Path, config: dict, target_config) -> EagleHead:
    """SafeAILab's one-layer head for this target, built from its config.json and loaded strictly."""
    hidden, layers = config.get("hidden_size", target_config.hidden_size), config.get("num_hidden_layers", 1)
    if hidden != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} is an EAGLE head for hidden size {hidden}, the target's is "
                                   f"{target_config.hidden_size}; use the head made for this target model")
    if layers != 1:
        raise InvalidArtifactError(f"{folder} is an EAGLE head of {layers} decoder layers; methods/eagle/ loads "
                                   f"one-layer EAGLE-1/2 heads (train one with: {TRAIN_COMMAND})")
    head = EagleHead(_upstream_layer_config(target_config, config), bias=bool(config.get("bias", True)))
    load_strictly(head, read_tensors(weights, UPSTREAM_FIX), weights, UPSTREAM_FIX, file_key=_from_upstream_keys,
                  provided={"body.embed_tokens.weight"}, dropped=_dropped_upstream_key)
    return head


def _upstream_layer_config(target_config, config: dict):
    """The target's config with the decoder-layer fields SafeAILab's head takes from its own config.json."""
    fields = {k: v for k, v in target_config.to_dict().items() if k not in ("rope_parameters", "rope_scaling")}
    fields.update({k: config[k] for k in UPSTREAM_LAYER_FIELDS if k in config})
    if "num_attention_heads" in config:  # upstream's EConfig: no num_key_value_heads means multi-head attention
        fields["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    fields["rope_theta"], fields["rope_scaling"] = config.get("rope_theta", 10000.0), config.get("rope_scaling")
    return type(target_config)(**fields)


def _from_upstream_keys(key: str) -> str:
    """EagleHead key -> SafeAILab's: `fc.*` as is, `body.layers.0.*` -> `layers.0.*`."""
    return key.removeprefix("body.")


def _dropped_upstream_key(name: str) -> bool:
    return name in ("embed_tokens.weight", "layers.0.input_layernorm.weight") or name.endswith("rotary_emb.inv_freq")
