"""DFlash checkpoints: the published layout (z-lab's `*-DFlash*` folders, the dflash package's DFlashDraftModel)
written and loaded strictly."""
from __future__ import annotations

from transformers import Qwen3Config

from methods.dflash.head import UPSTREAM_BLOCK_SIZE

ARCHITECTURE = "DFlashDraftModel"
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


def drafter_config(config: dict) -> tuple[Qwen3Config, list[int], int, int]:
    """(the layers' Qwen3Config, target_layer_ids, block_size, mask_token_id) of a published config.json."""
    from methods.dflash.head import upstream_target_layer_ids

    qwen3 = Qwen3Config(**{k: v for k, v in config.items() if k in QWEN3_FIELDS})
    layer_ids = dflash_field(config, "target_layer_ids")
    if layer_ids is None:
        layer_ids = upstream_target_layer_ids(config["num_target_layers"], qwen3.num_hidden_layers)
    return (qwen3, list(layer_ids), int(dflash_field(config, "block_size", UPSTREAM_BLOCK_SIZE)),
            int(dflash_field(config, "mask_token_id")))
