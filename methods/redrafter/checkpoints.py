"""ReDrafter checkpoints, strictly: this project's and upstream's published drafter folders."""
from __future__ import annotations

from pathlib import Path

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.saved import load_saved_heads
from methods.redrafter.head import PublishedRecurrentDrafter, RecurrentDrafterHead, SharedVocabRecurrentDrafter

TRAIN_COMMAND = "python -m bench.train method=redrafter"
UPSTREAM_FIX = (f"download the whole drafter folder again (huggingface-cli download <hub id>) or train one with: "
                f"{TRAIN_COMMAND}")
MODEL_TYPE = "recurrent_drafting_drafter"  # upstream's DrafterConfig.model_type
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CONFIG_FIELDS = ("vocab_size", "hidden_size", "exit_dim", "num_draft_layers", "rnn")


def load_redrafter(checkpoint: str | Path, target) -> tuple[RecurrentDrafterHead, DraftVocabulary, str]:
    """(drafter, vocabulary, fingerprint) of a checkpoint made by `python -m bench.train method=redrafter` or an
    upstream drafter folder (config.json with model_type recurrent_drafting_drafter, as save_pretrained writes it);
    on the target's device and dtype, reading the target's embedding."""
    folder = checkpoint_folder(checkpoint, "ReDrafter")
    config = read_json(folder / "config.json", UPSTREAM_FIX)
    lm_head = target.get_output_embeddings()
    if config.get("model_type") == MODEL_TYPE:
        drafter, vocab = _load_published(folder, config, target), DraftVocabulary(lm_head)
    elif config and config.get("specbench_method") != "redrafter":
        raise InvalidArtifactError(f"{folder}/config.json describes no recurrent drafter (model_type "
                                   f"{config.get('model_type')!r}); methods/redrafter/ loads upstream's drafters "
                                   f"(model_type {MODEL_TYPE}) and its own ({TRAIN_COMMAND})")
    else:
        drafter, vocab = load_saved_heads(folder, "redrafter", lambda saved: _own(saved, target), lm_head,
                                          TRAIN_COMMAND)
    drafter = drafter.to(target.device, target.dtype).eval().attach_embedding(target.get_input_embeddings())
    return drafter, vocab, artifact_fingerprint(folder)


def _own(config: dict, target) -> SharedVocabRecurrentDrafter:
    hidden_size = target.get_output_embeddings().weight.shape[1]
    return SharedVocabRecurrentDrafter(hidden_size, config["num_draft_layers"], config["rnn"], config["exit_dim"])


def _load_published(folder: Path, config: dict, target) -> PublishedRecurrentDrafter:
    """Upstream's drafter of config.json's DrafterConfig fields, refused in one line when a field is missing or its
    widths or vocabulary are not the target's, loaded strictly from model.safetensors (or pytorch_model.bin)."""
    missing = [field for field in CONFIG_FIELDS if field not in config]
    if missing:
        raise InvalidArtifactError(f"{folder}/config.json lacks {', '.join(missing)}; {UPSTREAM_FIX}")
    vocab_size, hidden_size = target.get_output_embeddings().weight.shape
    if config["hidden_size"] != hidden_size or config["vocab_size"] != vocab_size:
        raise InvalidArtifactError(f"{folder} drafts for a target of hidden size {config['hidden_size']} and "
                                   f"vocabulary {config['vocab_size']}, this target has {hidden_size} and "
                                   f"{vocab_size}; use the drafter published for this target")
    if config["num_draft_layers"] < 0 or config["exit_dim"] < 1:
        raise InvalidArtifactError(f"{folder}/config.json: num_draft_layers {config['num_draft_layers']}, exit_dim "
                                   f"{config['exit_dim']} describe no drafter; {UPSTREAM_FIX}")
    drafter = PublishedRecurrentDrafter(hidden_size, config["exit_dim"], config["num_draft_layers"],
                                        bool(config["rnn"]), vocab_size)
    file = next((folder / name for name in WEIGHT_FILES if (folder / name).exists()), None)
    if file is None:
        raise MissingArtifactError(f"{folder} has a recurrent drafter config.json but no "
                                   f"{' or '.join(WEIGHT_FILES)}; {UPSTREAM_FIX}")
    load_strictly(drafter, read_tensors(file, UPSTREAM_FIX), file, UPSTREAM_FIX)
    return drafter
