"""EAGLE-3 checkpoints: SafeAILab's layout (`yuhuili/EAGLE3-*`) and the speculators one that vLLM loads, both strict."""
from __future__ import annotations

from pathlib import Path

from transformers import LlamaConfig

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.eagle.checkpoints import UPSTREAM_WEIGHTS
from methods.eagle3.head import Eagle3Head, eagle3_feature_layers, layer_config
from methods.heads.common import checkpoint_folder, load_strictly, read_json, read_tensors

TRAIN_COMMAND = "python -m bench.train method=eagle3"
UPSTREAM_HEADS = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B for meta-llama/Llama-3.1-8B-Instruct (model=llama31_8b)"
POINT_AT_A_HEAD = (f"set method.drafter.checkpoint to the folder or hub id of an EAGLE-3 head made for this target "
                   f"(SafeAILab's or the speculators format, e.g. {UPSTREAM_HEADS})")
REFETCH = f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or {POINT_AT_A_HEAD}"
SPECULATORS_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def load_eagle3(checkpoint: str | Path | None, target) -> tuple[Eagle3Head, str]:
    """(head, fingerprint) from SafeAILab's layout or the speculators one, on the target's device and dtype.

    Strict: every parameter and buffer must be in the file with its shape, and every file key must be used, except
    `embed_tokens.weight` (optional: the head's own embedding when present, as upstream and vLLM load it; else the
    target's), `d2t` / `t2d` when the draft vocabulary is the target's (upstream deletes them; identity maps) and
    `*.rotary_emb.inv_freq` (recomputed). Anything else missing, unexpected or mis-shaped is refused in one line."""
    if not checkpoint:
        raise MissingArtifactError(f"EAGLE-3 needs a trained head and none is configured for this model "
                                   f"(method.drafter.checkpoint is unset); train one with: {TRAIN_COMMAND} "
                                   f"model=<model>, or {POINT_AT_A_HEAD}")
    folder = checkpoint_folder(checkpoint, "EAGLE-3")
    if not folder.exists():
        raise MissingArtifactError(f"EAGLE-3 head not found at {folder}; train it with: {TRAIN_COMMAND}, or "
                                   f"{POINT_AT_A_HEAD}")
    config = read_json(folder / "config.json", REFETCH)
    if not config:
        raise MissingArtifactError(f"{folder} has no config.json, so it is no EAGLE-3 checkpoint; {POINT_AT_A_HEAD}")
    speculators = is_speculators(config)
    names = SPECULATORS_WEIGHTS if speculators else UPSTREAM_WEIGHTS
    weights = next((folder / n for n in names if (folder / n).exists()), None)
    if weights is None:
        raise MissingArtifactError(f"{folder} holds no {' or '.join(names)}; {REFETCH}")
    tensors = read_tensors(weights, REFETCH)
    build = speculators_head if speculators else upstream_head
    head = build(folder, config, target, own_embedding="embed_tokens.weight" in tensors)
    same_vocab = head.lm_head.out_features == head.t2d.shape[0]
    file_key = speculators_key if speculators else (lambda key: key)
    load_strictly(head, tensors, weights, REFETCH, file_key=file_key,
                  provided={"d2t", "t2d"} if same_vocab else (),
                  dropped=lambda n: n.endswith("rotary_emb.inv_freq") or (same_vocab and n in ("d2t", "t2d")))
    return head.to(target.device, target.dtype).eval(), artifact_fingerprint(folder)


def speculators_key(key: str) -> str:
    """Eagle3Head key -> the speculators file's: `midlayer.*` -> `layers.0.*` (vLLM's llama_eagle3 reads both)."""
    return "layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key


def is_speculators(config: dict) -> bool:
    return config.get("speculators_model_type") == "eagle3" or "Eagle3Speculator" in config.get("architectures", [])


def upstream_head(folder: Path, config: dict, target, own_embedding: bool) -> Eagle3Head:
    """SafeAILab's head as its EaModel builds it from config.json (EConfig: num_key_value_heads defaults to the
    heads, rms_norm_eps 1e-6, rope_theta 10000 unless given; `target_hidden_size` when the head is narrower)."""
    if "draft_vocab_size" not in config:
        raise InvalidArtifactError(f"{folder / 'config.json'} has no draft_vocab_size, so it is no EAGLE-3 head (an "
                                   f"EAGLE-1/2 head? use method=eagle2 with its method.drafter.checkpoint); "
                                   f"{POINT_AT_A_HEAD}")
    fields = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048, **config}
    fields["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    return new_head(folder, layer_config(fields, target.config._attn_implementation), config, target, own_embedding)


def speculators_head(folder: Path, config: dict, target, own_embedding: bool) -> Eagle3Head:
    """The speculators format's head: the layer from `transformer_layer_config` (defaults: transformers' Llama
    config's, as speculators writes only the fields that differ), `norm_before_residual` as vLLM reads it (True
    when absent), the target layers from `eagle_aux_hidden_state_layer_ids` when given."""
    layer = dict(config.get("transformer_layer_config") or {})
    if config.get("norm_before_fc"):
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head with norm_before_fc, which methods/eagle3/ does not "
                                   f"build; {POINT_AT_A_HEAD}")
    if layer.get("num_hidden_layers", 1) != 1:
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head of {layer['num_hidden_layers']} decoder layers; "
                                   f"methods/eagle3/ builds one-layer heads; {POINT_AT_A_HEAD}")
    return new_head(folder, layer_config(layer, target.config._attn_implementation), config, target, own_embedding,
                    norm_before_residual=config.get("norm_before_residual", True))


def new_head(folder: Path, layer: LlamaConfig, config: dict, target, own_embedding: bool,
             norm_before_residual: bool = False) -> Eagle3Head:
    """The head for this target, after checking that the checkpoint was made for the target's widths."""
    target_config = target.config
    target_hidden = config.get("target_hidden_size") or layer.hidden_size
    if target_hidden != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head for a target of hidden size {target_hidden}, this "
                                   f"target's is {target_config.hidden_size}; {POINT_AT_A_HEAD}")
    if not own_embedding and layer.hidden_size != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} has no embed_tokens.weight and its width {layer.hidden_size} is not the "
                                   f"target's {target_config.hidden_size}; {REFETCH}")
    layers = config.get("eagle_aux_hidden_state_layer_ids") or eagle3_feature_layers(target_config.num_hidden_layers)
    draft_vocab = int(config.get("draft_vocab_size") or target_config.vocab_size)  # vLLM: the target's when absent
    return Eagle3Head(layer, target_hidden, target_config.vocab_size, draft_vocab, tuple(layers), norm_before_residual,
                      own_embedding)

