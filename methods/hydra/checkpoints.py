"""Hydra checkpoints: this project's (`python -m bench.train method=hydra`) and Hydra++'s published ones, strictly."""
from __future__ import annotations

import re
from pathlib import Path

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import load_saved_heads
from methods.hydra.heads import HydraHeads, HydraPrefixHeads

TRAIN_COMMAND = "python -m bench.train method=hydra"
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
        heads, vocab = load_saved_heads(folder, "hydra", lambda config: HydraHeads(
            lm_head.weight.shape[1], config["num_heads"], config["num_layers"]), lm_head, TRAIN_COMMAND)
    return heads.to(target.device, target.dtype).eval(), vocab, artifact_fingerprint(folder)


def _load_upstream(folder: Path, config: dict, target) -> HydraPrefixHeads:
    arch, grounded = config["hydra_head_arch"], config.get("grounded_heads", False)
    if arch != "prefix-mlp" or not grounded or config.get("hidden_state_offset", 0):
        raise InvalidArtifactError(f"{folder}: Hydra head architecture {arch!r} (grounded_heads={grounded}, "
                                   f"hidden_state_offset={config.get('hidden_state_offset', 0)}) is not supported; "
                                   f"methods/hydra/ loads Hydra++ (prefix-mlp, grounded, offset 0) and its own "
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
