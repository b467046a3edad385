"""Pieces shared by the methods that draft from the target's hidden states (Medusa, EAGLE, Hydra).

- `DraftVocabulary`: logits over the target's own LM head, or over a frequency-ranked slice of its rows (FR-Spec
  style). The slice adds no parameters and stays lossless: the target verifies every draft, and under sampling the
  draft's distribution is simply zero outside the slice.
- `ResBlock`: Medusa's residual block, x + SiLU(Linear(x)), zero-initialised so an untrained block is the identity.
- `save_heads` / `read_heads`: a checkpoint folder (config.json, fp16 model.safetensors, card.json).
- `save_atomically`: torch.save through a `.partial` file, so an interrupted write never leaves a half file.
- `read_json`, `read_tensors`, `load_strictly`: what every loader reads checkpoints with. A file that cannot be
  parsed (truncated, corrupt) and weights whose keys or shapes do not fit the module are refused in one line naming
  the file and the fix (`bench.errors.InvalidArtifactError`, exit status 2 from `python -m bench`).
"""
from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from bench.artifacts import resolve_artifact_path
from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree, first_nodes
from bench.errors import InvalidArtifactError, MissingArtifactError


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised (the identity until trained)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def most_frequent_tokens(labels: torch.Tensor, size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `size` token ids most frequent in `labels` (the target's own predictions on the training corpus), the
    `always` ids (special tokens) included; sorted ascending. [size] int64."""
    counts = torch.bincount(labels.flatten(), minlength=vocab_size).float()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    return counts.topk(min(size, vocab_size)).indices.sort().values


class DraftVocabulary(nn.Module):
    """Draft logits through the target's LM head, restricted to `token_ids` when given (None: full vocabulary).

    The sliced weight is a frozen copy ([V', H]); `to_token_ids` maps slice positions back to vocabulary ids and
    `slice_positions` maps vocabulary ids into the slice (-100 outside it, for cross-entropy's ignore_index).
    """

    def __init__(self, lm_head: nn.Linear, token_ids: torch.Tensor | None = None):
        super().__init__()
        weight, bias = lm_head.weight.detach(), getattr(lm_head, "bias", None)
        vocab_size = weight.shape[0]
        if token_ids is not None:
            token_ids = token_ids.to(weight.device)
            weight = weight[token_ids].clone()
            bias = None if bias is None else bias.detach()[token_ids].clone()
            position = torch.full((vocab_size,), -100, dtype=torch.long, device=weight.device)
            position[token_ids] = torch.arange(len(token_ids), device=weight.device)
            self.register_buffer("position", position, persistent=False)
        self.register_buffer("weight", weight, persistent=False)  # [V', H]
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)
        self.register_buffer("token_ids", token_ids, persistent=False)
        self.vocab_size = vocab_size

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V'] logits."""
        return nn.functional.linear(hidden, self.weight.to(hidden.dtype),
                                    None if self.bias is None else self.bias.to(hidden.dtype))

    def to_token_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions if self.token_ids is None else self.token_ids[positions]

    def slice_positions(self, token_ids: torch.Tensor) -> torch.Tensor:
        return token_ids if self.token_ids is None else self.position[token_ids]

    def full_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V'] probabilities over the slice -> [..., vocab], zero outside the slice."""
        if self.token_ids is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return full.index_copy_(-1, self.token_ids, probs)


def checkpoint_folder(checkpoint: str | Path, method: str) -> Path:
    """A checkpoint's local folder: a path (relative to the project root), else a hub id fetched into the HF cache
    (one line saying how to get it when that fails, e.g. offline)."""
    folder = resolve_artifact_path(checkpoint)
    if folder is not None:
        return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(checkpoint)))
    except Exception as err:  # offline, unknown id, no access
        raise MissingArtifactError(f"{method} checkpoint '{checkpoint}' cannot be fetched ({type(err).__name__}); "
                                   f"download it (huggingface-cli download {checkpoint}) and pass its folder") from err


class LastFeatureDrafter(Drafter):
    """Base of the drafters that draft from the target's feature at the last accepted token (Medusa, Hydra)."""

    feature_layers = (-1,)
    hidden: torch.Tensor | None = None  # [H]
    template: DraftTree  # the static tree (subclasses set it, and `templates = {}`)
    templates: dict[int, DraftTree]  # template_of's, by size

    def start(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.hidden = hidden[-1]

    def update(self, step) -> None:
        self.hidden = step.hidden[step.acceptance.rows[-1]]

    def template_of(self, nodes: int) -> DraftTree:
        """The static tree's first `nodes` nodes, made once per size (masks and positions built once too)."""
        if nodes not in self.templates:
            self.templates[nodes] = first_nodes(self.template, nodes)
        return self.templates[nodes]


def heads_or_checkpoint(module, vocab, checkpoint, target, load) -> tuple:
    """(module, vocabulary, artifact fingerprint): the module passed in (tests, notebooks; no fingerprint), else
    `load(checkpoint, target)`."""
    if module is None:
        return load(checkpoint, target)
    return module, vocab or DraftVocabulary(target.get_output_embeddings()), None


def save_heads(out_dir: Path, config: dict, state: dict[str, torch.Tensor], card: dict) -> None:
    """config.json, model.safetensors (floating tensors stored as fp16) and card.json in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach()).contiguous().cpu()
               for k, v in state.items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")


def read_heads(folder: Path, method: str, train_command: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) of a checkpoint written by save_heads for `method`; a clear error when it is missing."""
    if not (folder / "config.json").exists():
        raise MissingArtifactError(f"{method} checkpoint not found at {folder}; make it with: {train_command}")
    fix = f"remake it with: {train_command}"
    config = read_json(folder / "config.json", fix)
    if config.get("specbench_method") != method:
        raise MissingArtifactError(f"{folder} holds no {method} checkpoint of this project (config.json says "
                                   f"{config.get('specbench_method')!r}); make one with: {train_command}")
    return config, read_tensors(folder / "model.safetensors", fix)


def save_atomically(tensors: dict, path: Path) -> None:
    """torch.save to `path` through `<path>.partial`, so a reader never sees a half-written file."""
    partial = path.with_suffix(".partial")
    torch.save(tensors, partial)
    partial.replace(path)


def read_json(path: Path, fix: str) -> dict:
    """A JSON object file ({} when absent); unparsable JSON is refused in one line."""
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidArtifactError(f"{path} is not valid JSON ({_first_line(err)}); {fix}") from err
    if not isinstance(value, dict):
        raise InvalidArtifactError(f"{path} holds a JSON {type(value).__name__}, not an object; {fix}")
    return value


def read_tensors(file: Path, fix: str, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file or a torch pickle (.pt/.bin/.pth) whose names start with `prefix`, the
    prefix removed; on the CPU. A missing file, and one that cannot be parsed (truncated, corrupt), are refused in one
    line naming it and `fix`."""
    if not file.exists():
        raise MissingArtifactError(f"{file} not found; {fix}")
    try:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                return {k.removeprefix(prefix): f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except Exception as err:  # SafetensorError, zip / pickle errors, OSError on a cut-short file, ...
        raise InvalidArtifactError(f"{file} cannot be read ({type(err).__name__}: {_first_line(err)}): truncated or "
                                   f"corrupt; {fix}") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InvalidArtifactError(f"{file} holds no flat dict of tensors (a {type(state).__name__}); {fix}")
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def load_strictly(module: nn.Module, tensors: dict[str, torch.Tensor], source, fix: str,
                  file_key: Callable[[str], str] = lambda key: key, provided: Iterable[str] = (),
                  dropped: Callable[[str], bool] = lambda key: False) -> None:
    """Load `tensors` (named as in the file) into `module`: every module key but those `provided` otherwise must be
    in the file, as `file_key(key)` and with its shape, and every file key must be used or `dropped` (deliberately
    ignored); else one line naming `source`, the keys at fault (first few, and how many) and `fix`."""
    provided = set(provided)
    wanted = [(key, file_key(key), value.shape) for key, value in module.state_dict().items() if key not in provided]
    used = {name for _, name, _ in wanted}
    missing = sorted(name for name in used if name not in tensors)
    unexpected = sorted(name for name in tensors if name not in used and not dropped(name))
    misshaped = sorted({f"{name} {list(tensors[name].shape)} not {list(shape)}" for _, name, shape in wanted
                        if name in tensors and tensors[name].shape != shape})
    faults = [key_summary(keys, what) for keys, what in ((missing, "missing"), (unexpected, "unexpected"),
                                                  (misshaped, "of the wrong shape")) if keys]
    if faults:
        raise InvalidArtifactError(f"{source} does not fit: {'; '.join(faults)}; {fix}")
    module.load_state_dict({key: tensors[name] for key, name, _ in wanted}, strict=False)


def key_summary(keys: list[str], what: str, shown: int = 3) -> str:
    """'2 keys missing (a, b)', '7 keys unexpected (a, b, c, ...)'."""
    more = ", ..." if len(keys) > shown else ""
    return f"{len(keys)} key{'s' if len(keys) > 1 else ''} {what} ({', '.join(keys[:shown])}{more})"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]


def one_layer_config(target_config):
    """The target's config cut to one decoder layer and a one-row embedding table (inputs come as embeddings)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:1]
    config.vocab_size, config.pad_token_id = 1, None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config
