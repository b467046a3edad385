"""SpS's draft model: a slice of the target's own layers (made, saved, loaded) or any Hugging Face causal LM."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from bench.artifacts import (
    RELEASED_MODEL,
    artifact_fingerprint,
    cache_dir,
    partial_folder,
    publish_folder,
    resolve_artifact_path,
)
from bench.config import compose_config
from bench.errors import InvalidArtifactError, MissingArtifactError
from bench.models import dequantized_gguf
from methods.heads.common import key_summary, load_strictly, read_tensors

SHARED_FLAG = "specbench_shares_target_embeddings"  # config.json key: embedding and LM head come from the target


def slice_target(target, layers: list[int], dtype: torch.dtype | None = None):
    """A draft made of the target's decoder `layers` (copied), its final norm (copied) and its embedding and
    LM head (shared modules, not copied)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    if hasattr(config, "quantization_config"):  # the GGUF target is dequantized on load; the draft is plain
        del config.quantization_config
    setattr(config, SHARED_FLAG, True)
    config.specbench_target_layers = list(layers)
    draft = AutoModelForCausalLM.from_config(config, dtype=dtype or target.dtype)
    for mine, source in zip(draft.model.layers, layers):
        mine.load_state_dict(target.model.layers[source].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    _attach_shared(draft, target)
    return draft.to(target.device).eval()


def _attach_shared(draft, target) -> None:
    draft.set_input_embeddings(target.get_input_embeddings())
    draft.set_output_embeddings(target.get_output_embeddings())


def own_state(draft) -> dict[str, torch.Tensor]:
    """The draft's weights minus the embedding and LM head it shares with the target."""
    shared = {id(p) for module in (draft.get_input_embeddings(), draft.get_output_embeddings())
              for p in module.parameters()}
    return {name: p for name, p in draft.named_parameters() if id(p) not in shared}


def save_draft(draft, out_dir: Path, card: dict) -> None:
    """A standard HF checkpoint (config.json + fp16 model.safetensors) without the shared weights, plus card.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(draft.config)
    config.dtype = torch.float16
    config.save_pretrained(out_dir)
    state = {name: p.detach().to(torch.float16).contiguous() for name, p in own_state(draft).items()}
    save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")


def resolve_draft_path(path: str | Path) -> Path | None:
    """A local draft folder: `model:<name>` is the model conf/model/<name>.yaml installs (a released draft, e.g.
    `model:qwen25_coder_0p5b`), else a folder (absolute, or relative to the project root); None for a hub id."""
    if str(path).startswith(RELEASED_MODEL):
        return installed_model(str(path).removeprefix(RELEASED_MODEL))
    return resolve_artifact_path(path)


def installed_model(name: str) -> Path:
    """The loadable folder of conf/model/<name>.yaml's model (fetched, assembled and dequantized on first use); a
    hub-only model's `path` as it is."""
    model = compose_config(f"model={name}").model
    return dequantized_gguf(model) if model.get("gguf_file") else Path(model.path)


def load_draft(path: str | Path, target, train_command: str = "python -m bench.train method=sps"):
    """Load a draft on the target's device and dtype, strictly; reattach the target's embedding and LM head when
    shared."""
    local = resolve_draft_path(path)
    if local is not None and not (local / "config.json").exists():
        raise MissingArtifactError(f"SpS draft not found at {local}; make it with: {train_command}")
    source = str(local or path)
    try:
        config = AutoConfig.from_pretrained(source)
        if getattr(config, SHARED_FLAG, False):
            draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
            _attach_shared(draft, target)
            shared = set(draft.state_dict()) - set(own_state(draft))
            fix, weights = f"remake it with: {train_command}", local / "model.safetensors"
            load_strictly(draft, read_tensors(weights, fix), f"SpS draft {weights}", fix, provided=shared)
        else:
            draft = _pretrained_strictly(source, target.dtype, train_command)
    except OSError as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise MissingArtifactError(f"SpS draft '{source}' cannot be loaded ({reason}); download it to the HF cache "
                                   f"or set method.drafter.draft_path to a local copy") from err
    if draft.config.vocab_size != target.config.vocab_size:
        raise InvalidArtifactError(f"SpS draft '{source}' has a vocabulary of {draft.config.vocab_size} tokens, the "
                                   f"target {target.config.vocab_size}; set method.drafter.draft_path to a draft with "
                                   f"the target's tokenizer")
    return draft.to(target.device).eval()


def _pretrained_strictly(source: str, dtype: torch.dtype, train_command: str):
    """AutoModelForCausalLM.from_pretrained, refusing in one line what it would only log: missing tensors (it
    initialises them at random), unexpected and mis-shaped ones; and an unreadable weights file."""
    fix = (f"download the draft again (huggingface-cli download <hub id>), set method.drafter.draft_path to a "
           f"complete copy, or make one with: {train_command}")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its multi-line load report: the faults are reported below
    try:
        draft, info = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, output_loading_info=True,
                                                           ignore_mismatched_sizes=True)
    except OSError:  # not there or not downloadable: load_draft says how to get it
        raise
    except Exception as err:  # SafetensorError, zip / pickle errors of a truncated or corrupt file
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise InvalidArtifactError(f"SpS draft '{source}' has a weights file that cannot be read "
                                   f"({type(err).__name__}: {reason}): truncated or corrupt; {fix}") from err
    finally:
        hf_logging.set_verbosity(verbosity)
    faults = [(sorted(info["missing_keys"]), "missing"), (sorted(info["unexpected_keys"]), "unexpected"),
              (sorted(f"{key} {list(got)} not {list(wanted)}" for key, got, wanted in info["mismatched_keys"]),
               "of the wrong shape")]
    faults = [key_summary(keys, what) for keys, what in faults if keys]
    if faults:
        raise InvalidArtifactError(f"SpS draft '{source}' does not fit its config: {'; '.join(faults)}; {fix}")
    return draft


def standalone_draft(path: str | Path, target_dir: Path) -> Path:
    """A copy of the draft at `path` that any engine loads on its own: a draft sharing the target's embedding and LM
    head gets the target's `model.embed_tokens.weight` (and `lm_head.weight` where they are not tied; from
    `target_dir`, a safetensors folder) and its tokenizer, written once into the cache (keyed by both folders'
    fingerprints); any other draft is returned as is."""
    local = resolve_draft_path(path)
    if local is None or not (local / "config.json").exists():
        raise MissingArtifactError(f"no draft at {path} (a local folder with config.json); train it (python -m "
                                   f"bench.train method=<its method>) or point the config at another")
    config = json.loads((local / "config.json").read_text())
    if not config.get(SHARED_FLAG):
        return local
    out = cache_dir() / "models" / f"{local.name}-standalone-{artifact_fingerprint(local)}-" \
                                   f"{artifact_fingerprint(target_dir)}"
    if (out / "model.safetensors").exists():
        return out
    fix = "remake it with: python -m bench.train method=sps"
    state = {k: v.float() for k, v in read_tensors(local / "model.safetensors", fix).items()}
    target = read_tensors(target_dir / "model.safetensors", "")
    tied = config.get("tie_word_embeddings", True)  # the target's, copied into the draft's config
    for name in ("model.embed_tokens.weight",) if tied else ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = target[name].float()
    tmp = partial_folder(out)
    config = {k: v for k, v in config.items() if not k.startswith("specbench_")}
    (tmp / "config.json").write_text(json.dumps({**config, "dtype": "float32"}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, tmp / name)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    return publish_folder(tmp, out)
