"""ReDrafter checkpoints, strictly: this project's and upstream's published drafter folders; and ours rewritten in
upstream's layout (`python -m bench.convert redrafter`)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.convert import Converter
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


# --- ours in upstream's layout: python -m bench.convert redrafter <ours> <out> [model=...] ------------------------
OUTSIDE_SLICE_LOGIT = -1.0e4
SILENT_BIAS = -100.0  # SiLU(-100) is 0 in float32: a ResBlock adds nothing to the constant dimension


def upstream_layout(drafter: SharedVocabRecurrentDrafter, vocab: DraftVocabulary) -> tuple[dict, dict]:
    """(config.json, float32 tensors) of `drafter` in upstream's layout (apple/ml-recurrent-drafter's `Drafter`, as
    `save_pretrained` writes it and `AutoModel.from_pretrained` loads it), drafting the same beams, for the target
    whose LM head `vocab` reads.

    Ours scores through a projection `lm_head.{L}` [H, exit_dim] into the target's LM head (or its draft-vocabulary
    slice); upstream's final layer is a [vocab, exit_dim] table with no bias. The rewrite is exact up to rounding: the
    table is W lm_head.{L} for the slice's rows W of the target's LM head, and one more exit dimension holds a
    constant 1 (input_proj's bias; each ResBlock leaves it alone: its row of A is zero and its bias -100, so SiLU adds
    0), through which the table adds the target LM head's bias and gives the tokens outside the slice a logit of -1e4
    (below the 50 best that upstream's drafter keeps). The folder is big (a vocab x (exit_dim + 1) table; SmolLM2:
    227 MB in float32) and is not committed."""
    hidden, exit_dim, layers = drafter.hidden_size, drafter.exit_dim, drafter.num_draft_layers
    state = {k: v.double() for k, v in drafter.state_dict().items()}
    proj = state.get("input_proj.weight", torch.eye(2 * hidden, dtype=torch.float64))
    proj_bias = state.get("input_proj.bias", torch.zeros(exit_dim, dtype=torch.float64))
    tensors = {"input_proj.weight": _pad(proj, rows=1),
               "input_proj.bias": torch.cat([proj_bias, torch.ones(1, dtype=torch.float64)])}
    for i in range(layers):
        tensors[f"lm_head.{i}.linear.weight"] = _pad(state[f"lm_head.{i}.linear.weight"], rows=1, cols=1)
        tensors[f"lm_head.{i}.linear.bias"] = torch.cat([state[f"lm_head.{i}.linear.bias"],
                                                         torch.full((1,), SILENT_BIAS, dtype=torch.float64)])
    table = torch.zeros(vocab.vocab_size, exit_dim + 1, dtype=torch.float64)
    table[:, exit_dim] = OUTSIDE_SLICE_LOGIT
    rows = vocab.to_token_ids(torch.arange(vocab.size, device=vocab.weight.device)).cpu()
    table[rows, :exit_dim] = vocab.weight.double().cpu() @ state[f"lm_head.{layers}.weight"]
    table[rows, exit_dim] = 0.0 if vocab.bias is None else vocab.bias.double().cpu()
    tensors[f"lm_head.{layers}.weight"] = table
    tensors |= {k: v for k, v in state.items() if k.startswith("rnn_")}
    config = {"model_type": MODEL_TYPE, "architectures": ["Drafter"], "vocab_size": vocab.vocab_size,
              "hidden_size": hidden, "exit_dim": exit_dim + 1, "num_draft_layers": layers,
              "num_lookback_tokens": -1, "rnn": drafter.rnn}
    return config, {name: value.float().contiguous() for name, value in tensors.items()}


def _pad(weight: torch.Tensor, rows: int = 0, cols: int = 0) -> torch.Tensor:
    return torch.nn.functional.pad(weight, (0, cols, 0, rows))


def write_upstream_layout(drafter: SharedVocabRecurrentDrafter, vocab: DraftVocabulary, out_dir: Path) -> None:
    """config.json and float32 model.safetensors of upstream_layout in `out_dir`."""
    config, tensors = upstream_layout(drafter, vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=2) + "\n")


CONVERTER = Converter("apple/ml-recurrent-drafter's Drafter layout", load_redrafter, SharedVocabRecurrentDrafter,
                      write_upstream_layout)
