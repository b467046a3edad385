"""MLPSpeculator checkpoints, strictly: this project's, IBM's accelerator layout and the `speculators` package's."""
from __future__ import annotations

import re
from pathlib import Path

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import load_saved_heads
from methods.mlp_speculator.head import MLPSpeculatorStages, PublishedMLPSpeculator, SharedVocabMLPSpeculator

TRAIN_COMMAND = "python -m bench.train method=mlp_speculator"
UPSTREAM_FIX = (f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or train one with: "
                f"{TRAIN_COMMAND}")
IBM_ARCHITECTURE = "MLPSpeculatorPreTrainedModel"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
IBM_PREFIX = "speculator."  # some IBM files name their tensors speculator.emb.0.weight (vLLM strips it)
# speculators' module names for ours (its layernorms are torch's nn.LayerNorm); what it may save of the verifier
SPECULATORS_NAMES = {"emb": "emb_layers", "proj": "proj_layers", "ln": "layernorms", "head": "head"}
VERIFIER_KEYS = ("embed_tokens.", "lm_head.", "verifier.")
STAGE_KEY = re.compile(r"(emb|proj|ln|head)\.(\d+)\.(.+)")


def load_mlp_speculator(checkpoint: str | Path, target) -> tuple[MLPSpeculatorStages, DraftVocabulary, str]:
    """(stages, vocabulary, fingerprint) of a checkpoint made by `python -m bench.train method=mlp_speculator`, an
    IBM accelerator folder (config.json with architectures [MLPSpeculatorPreTrainedModel]) or a `speculators` one
    (speculators_model_type mlp); on the target's device and dtype."""
    folder = checkpoint_folder(checkpoint, "MLPSpeculator")
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    lm_head = target.get_output_embeddings()
    if IBM_ARCHITECTURE in (config.get("architectures") or []):
        stages, vocab = _load_published(folder, _ibm_shape(folder, config), target), DraftVocabulary(lm_head)
    elif config.get("speculators_model_type") == "mlp":
        stages, vocab = _load_published(folder, _speculators_shape(folder, config), target), DraftVocabulary(lm_head)
    elif config and config.get("specbench_method") != "mlp_speculator":
        raise InvalidArtifactError(f"{folder}/config.json describes no MLPSpeculator (architectures "
                                   f"{config.get('architectures')}, no speculators_model_type mlp); methods/"
                                   f"mlp_speculator/ loads IBM's accelerator layout ({IBM_ARCHITECTURE}), speculators' "
                                   f"mlp one and its own ({TRAIN_COMMAND})")
    else:
        stages, vocab = load_saved_heads(folder, "mlp_speculator", lambda saved: _own(saved, target), lm_head,
                                         TRAIN_COMMAND)
    stages = stages.to(target.device, target.dtype).eval()
    return stages, vocab, artifact_fingerprint(folder)


def _own(config: dict, target) -> SharedVocabMLPSpeculator:
    """This project's stages as config.json describes them, with its candidates."""
    stages = SharedVocabMLPSpeculator(target.get_output_embeddings().weight.shape[1], config["n_predict"],
                                      config.get("scale_input", False))
    stages.candidates = {key: config.get(key, default) for key, default in stages.candidates.items()}
    return stages.attach_embedding(target.get_input_embeddings())


def _ibm_shape(folder: Path, config: dict) -> dict:
    """PublishedMLPSpeculator's arguments and the candidates of IBM's config.json (fms-extras' MLPSpeculatorConfig:
    emb_dim, inner_dim (0: emb_dim), vocab_size, n_predict, top_k_tokens_per_head, n_candidates, tie_weights,
    scale_input)."""
    _require(folder, config, ("emb_dim", "vocab_size", "n_predict"))
    n_predict = config["n_predict"]
    top_k = config.get("top_k_tokens_per_head", [])
    if len(top_k) != n_predict:
        raise InvalidArtifactError(f"{folder}/config.json: top_k_tokens_per_head {top_k} has not n_predict="
                                   f"{n_predict} entries; {UPSTREAM_FIX}")
    return {"emb_dim": config["emb_dim"], "inner_dim": config.get("inner_dim") or config["emb_dim"],
            "vocab_size": config["vocab_size"], "n_predict": n_predict, "tie_weights": config.get("tie_weights", False),
            "scale_input": config.get("scale_input", False), "norm": "rms", "names": None,
            "candidates": {"top_k_tokens_per_head": list(top_k), "n_candidates": config.get("n_candidates", 5)}}


def _speculators_shape(folder: Path, config: dict) -> dict:
    """PublishedMLPSpeculator's arguments for speculators' MLPSpeculatorConfig (hidden_size, intermediate_size,
    vocab_size, num_layers, tie_weights (default true), torch LayerNorms); fms-extras' candidates for its depth.
    Only checkpoints that read the target's normalised last hidden state (inputs_hidden_states_normalized: true)
    draft from what the engine hands a drafter."""
    _require(folder, config, ("hidden_size", "vocab_size", "num_layers"))
    if not config.get("inputs_hidden_states_normalized", False):
        raise InvalidArtifactError(f"{folder}/config.json: this speculators mlp checkpoint reads the target's hidden "
                                   f"state before its final norm (inputs_hidden_states_normalized false); the engine "
                                   f"hands drafters the normalised one, so it cannot draft here")
    return {"emb_dim": config["hidden_size"], "inner_dim": config.get("intermediate_size") or config["hidden_size"],
            "vocab_size": config["vocab_size"], "n_predict": config["num_layers"],
            "tie_weights": config.get("tie_weights", True), "scale_input": False, "norm": "layer",
            "names": SPECULATORS_NAMES, "candidates": None}


def _require(folder: Path, config: dict, fields: tuple[str, ...]) -> None:
    missing = [field for field in fields if field not in config]
    if missing:
        raise InvalidArtifactError(f"{folder}/config.json lacks {', '.join(missing)}; {UPSTREAM_FIX}")


def _load_published(folder: Path, shape: dict, target) -> PublishedMLPSpeculator:
    """The published stages of `shape`, refused in one line when their widths or vocabulary are not the target's,
    loaded strictly from model.safetensors (or pytorch_model.bin)."""
    vocab_size, hidden_size = target.get_output_embeddings().weight.shape
    if shape["emb_dim"] != hidden_size or shape["vocab_size"] != vocab_size:
        raise InvalidArtifactError(f"{folder} drafts for a target of hidden size {shape['emb_dim']} and vocabulary "
                                   f"{shape['vocab_size']}, this target has {hidden_size} and {vocab_size}; use the "
                                   f"speculator published for this target")
    tied, names = shape["tie_weights"], shape["names"]
    if tied and shape["n_predict"] < 2:
        raise InvalidArtifactError(f"{folder}/config.json ties the weights of a single stage (n_predict 1); "
                                   f"{UPSTREAM_FIX}")
    stages = PublishedMLPSpeculator(shape["emb_dim"], shape["inner_dim"], vocab_size, shape["n_predict"], tied,
                                    shape["scale_input"], shape["norm"])
    if shape["candidates"] is not None:
        stages.candidates = shape["candidates"]
    file = next((folder / name for name in WEIGHT_FILES if (folder / name).exists()), None)
    if file is None:
        raise MissingArtifactError(f"{folder} has an MLPSpeculator config.json but no {' or '.join(WEIGHT_FILES)}; "
                                   f"{UPSTREAM_FIX}")
    tensors = {name.removeprefix(IBM_PREFIX): value for name, value in read_tensors(file, UPSTREAM_FIX).items()}
    canonical = {_file_key(k, tied, names) for k in stages.state_dict()}
    load_strictly(stages, tensors, file, UPSTREAM_FIX, file_key=lambda key: _file_key(key, tied, names),
                  dropped=lambda name: name.startswith(VERIFIER_KEYS) or tied and _is_tied_copy(name, canonical))
    return stages


def _file_key(key: str, tied: bool, names: dict | None) -> str:
    """Our key -> the file's: a tied stage's tensor is read from the stage that holds it (emb / head / ln: 0,
    proj: 1 from stage 1 on), and speculators' module names replace ours."""
    match = STAGE_KEY.fullmatch(key)
    if match is None:
        return key
    kind, stage, rest = match.group(1), int(match.group(2)), match.group(3)
    if tied:
        stage = min(stage, 1) if kind == "proj" else 0
    return f"{(names or {}).get(kind, kind)}.{stage}.{rest}"


def _is_tied_copy(name: str, canonical: set[str]) -> bool:
    """A file key naming another stage's copy of a tied tensor (written by a plain torch.save of tied modules)."""
    match = re.fullmatch(r"(\w+)\.(\d+)\.(.+)", name)
    return bool(match) and any(c.startswith(f"{match.group(1)}.") and c.endswith(f".{match.group(3)}")
                               for c in canonical)

