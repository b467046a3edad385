"""MLPSpeculator checkpoints, strictly: this project's, IBM's accelerator layout and the `speculators` package's; and
ours rewritten in IBM's layout (`python -m bench.convert mlp_speculator`)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.artifacts import artifact_fingerprint
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, checkpoint_folder, load_strictly, read_json, read_tensors
from methods.heads.convert import Converter
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


# --- ours in IBM's accelerator layout: python -m bench.convert mlp_speculator <ours> <out> [model=...] -----------
CONSTANT_BIAS = 1.0  # the constant dimension's value before GELU
OUTSIDE_SLICE_LOGIT = -1.0e4  # tokens outside the draft vocabulary (fp16-safe)


def ibm_layout(stages: SharedVocabMLPSpeculator, vocab: DraftVocabulary) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, float32 tensors) of `stages` in IBM's accelerator layout, the one vLLM's `method:
    mlp_speculator` (and TGI) loads, drafting the same candidates, for the target whose embedding they hold and whose
    LM head `vocab` reads.

    IBM's stages have private [vocab, inner_dim] tables and no head bias; ours read the target's embedding through
    `emb_in.{i}` and score through `out.{i}` (with a bias) into the target's LM head or its draft-vocabulary slice.
    The rewrite is exact up to rounding and the norms' eps: emb_i = E emb_in_i^T and head_i = W out_i for the slice's
    rows W of the LM head; one more inner dimension holds a constant (its norm weight 0, bias 1, so GELU(1) after the
    norm), through which head_i adds the bias W b_i and gives the tokens outside the slice a logit of -1e4. The extra
    dimension changes inner_dim, and with it the norm's mean and emb_weight; the norm weights and the embeddings are
    rescaled by sqrt(H / (H + 1)) to match. The folder is big (2 n_predict tables of vocab x (H + 1); SmolLM2: 340 MB
    in fp16) and is not committed."""
    hidden, n_predict = stages.inner_dim, stages.n_predict
    shrink = math.sqrt(hidden / (hidden + 1))
    constant = torch.nn.functional.gelu(torch.tensor(CONSTANT_BIAS, dtype=torch.float64))
    embedding = stages.target_embedding.double()
    lm_head = vocab.weight.double()  # [V', H]: the draft vocabulary's rows of the LM head
    bias = vocab.bias.double() if vocab.bias is not None else torch.zeros(vocab.size, dtype=torch.float64)
    tensors = {}
    for i in range(n_predict):
        proj = stages.proj[i].weight.double()
        tensors[f"proj.{i}.weight"] = _pad(proj, rows=1, cols=0 if i == 0 else 1)
        tensors[f"emb.{i}.weight"] = _pad(embedding @ stages.emb_in[i].weight.double().T * shrink, cols=1)
        ln = stages.ln[i]
        tensors[f"ln.{i}.weight"] = torch.cat([ln.weight.double() * shrink, torch.zeros(1, dtype=torch.float64)])
        tensors[f"ln.{i}.bias"] = torch.cat([ln.bias.double(), torch.full((1,), CONSTANT_BIAS, dtype=torch.float64)])
        out = stages.out[i]
        head = torch.zeros(vocab.vocab_size, hidden + 1, dtype=torch.float64)
        head[:, hidden] = OUTSIDE_SLICE_LOGIT / constant
        rows = vocab.to_token_ids(torch.arange(vocab.size, device=lm_head.device))
        head[rows, :hidden] = lm_head @ out.weight.double()
        head[rows, hidden] = (lm_head @ out.bias.double() + bias) / constant
        tensors[f"head.{i}.weight"] = head
    config = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator",
              "emb_dim": hidden, "inner_dim": hidden + 1, "vocab_size": vocab.vocab_size, "n_predict": n_predict,
              **stages.candidates, "tie_weights": False, "scale_input": stages.ln0 is not None}
    return config, {name: value.float().contiguous() for name, value in tensors.items()}


def _pad(weight: torch.Tensor, rows: int = 0, cols: int = 0) -> torch.Tensor:
    return torch.nn.functional.pad(weight, (0, cols, 0, rows))


def write_ibm_layout(stages: SharedVocabMLPSpeculator, vocab: DraftVocabulary, out_dir: Path,
                     dtype: torch.dtype = torch.float16) -> None:
    """config.json and model.safetensors (fp16 by default, as IBM publishes) of ibm_layout in `out_dir`."""
    config, tensors = ibm_layout(stages, vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype) for k, v in tensors.items()}, out_dir / "model.safetensors", metadata={"format": "pt"})
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


CONVERTER = Converter("IBM's accelerator layout: vLLM's method mlp_speculator", load_mlp_speculator,
                      SharedVocabMLPSpeculator, write_ibm_layout)
