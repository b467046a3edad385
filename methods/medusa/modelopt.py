"""Medusa heads the NVIDIA ModelOpt way (optional extra: `pip install -e ".[modelopt]"`), driven by our MedusaDrafter.

ModelOpt's workflow: `mtsp.convert(model, [("medusa", {"medusa_num_heads": K, "medusa_num_layers": L})])` (mtsp =
modelopt.torch.speculative) adds `model.medusa_heads`, per head L ResBlocks and its own vocabulary Linear (the
upstream Medusa layout); the heads are trained with the base frozen (`freeze_base_model=True` in its forward, once
called `medusa_only_heads`; convert itself leaves the base trainable, so only the heads are optimised); then
`mto.save(model, path)` (mto = modelopt.torch.opt) writes ONE file, a torch pickle of {"modelopt_state": the
modes and their configs, "model_state_dict": the whole model's weights, base included}, and
`mto.restore(fresh_model, path)` converts a fresh model of the same architecture and loads them all (strictly).
Its Hugging Face route (`mto.enable_huggingface_checkpointing()`, then `save_pretrained`, as its example trainer
does) writes a model folder instead: config.json, the weights with `medusa_heads.*` among them, and
`modelopt_state.pth` (the modes only).

- `python -m bench.train method=medusa train.backend=modelopt`: converts the target and trains only its heads on
  the shared cached features (methods/heads/training.py), with the loss ModelOpt's forward computes under
  freeze_base_model=True (0.2 x sum_k 0.8^k CE_k, labels = the target's own next tokens), then writes
  `<train.modelopt.out_dir>/modelopt_medusa.pth` with `mto.save`, and card.json.
- `load_modelopt_medusa(path, target)`: that file (or its folder), any file `mto.save` wrote, or a Hugging Face
  folder with modelopt_state.pth -> (MedusaHeads with private projections, full DraftVocabulary), restored by
  ModelOpt on a fresh model of the target's architecture; the caller's target is not touched.
"""
from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from bench.errors import ConfigError, MissingArtifactError
from methods.heads.common import DraftVocabulary
from methods.heads.settings import TrainingRun
from methods.medusa.heads import MedusaHeads
from methods.medusa.train import MedusaRecipe

SAVED_FILE = "modelopt_medusa.pth"  # what train.backend=modelopt writes with mto.save (checkpoints.py detects it)
HF_STATE_FILE = "modelopt_state.pth"  # ModelOpt's Hugging Face checkpointing, beside save_pretrained's weights
INSTALL = 'pip install -e ".[modelopt]"'


def import_modelopt():
    """(mtsp, mto): modelopt.torch.speculative and modelopt.torch.opt, or an error that names the extra."""
    try:
        with warnings.catch_warnings():  # "transformers 5.24.0 is not tested with current version of modelopt"
            warnings.filterwarnings("ignore", message=r"transformers .* is not tested")
            import modelopt.torch.opt as mto
            import modelopt.torch.speculative as mtsp
    except ImportError as error:
        raise MissingArtifactError(f"NVIDIA ModelOpt is not installed ({error}); Medusa's ModelOpt backend and "
                                   f"checkpoints need the optional extra: {INSTALL}") from error
    return mtsp, mto


def heads_view(medusa_heads: nn.ModuleList) -> MedusaHeads:
    """A MedusaHeads made of ModelOpt's own modules (`medusa_heads[k]` = Sequential(ResBlock x L, Linear)): the
    parameters are shared, not copied, and the state dict has MedusaHeads' keys."""
    view = MedusaHeads(medusa_heads[0][-1].in_features, len(medusa_heads), num_layers=0)
    view.blocks = nn.ModuleList(head[:-1] for head in medusa_heads)
    view.projections = nn.ModuleList(head[-1] for head in medusa_heads)
    return view


def own_heads(medusa_heads: nn.ModuleList) -> MedusaHeads:
    """ModelOpt's heads as this project's MedusaHeads (private projections), holding the same tensors."""
    view = heads_view(medusa_heads)
    projection = view.projections[0]
    with torch.device("meta"):
        heads = MedusaHeads(projection.in_features, view.num_heads, len(view.blocks[0]),
                            private_vocab_size=projection.out_features)
    heads.load_state_dict(view.state_dict(), assign=True)
    return heads


def medusa_config(num_heads: int, num_layers: int) -> list:
    """The mode list of `mtsp.convert` for Medusa."""
    return [("medusa", {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers})]


def fresh_model(target, device: torch.device | str):
    """A model of the target's class and config with uninitialised weights on `device` ("meta": no storage):
    what ModelOpt restores into, so that the caller's target is never converted."""
    with torch.device("meta"):
        model = type(target)(copy.deepcopy(target.config)).to(target.dtype)
    return model if str(device) == "meta" else model.to_empty(device=device)


def load_modelopt_medusa(path: str | Path, target) -> tuple[MedusaHeads, DraftVocabulary]:
    """(heads, full vocabulary) from an `mto.save` file, a folder holding SAVED_FILE, or a Hugging Face folder
    with modelopt_state.pth (ModelOpt's save_pretrained route); on the CPU (load_medusa moves them to the target)."""
    _, mto = import_modelopt()
    path = Path(path)
    saved = path if path.is_file() else path / SAVED_FILE
    if saved.exists():
        model = mto.restore(fresh_model(target, "cpu"), saved, mmap=True)
    elif (path / HF_STATE_FILE).exists():
        model = mto.restore_from_modelopt_state(fresh_model(target, "meta"), modelopt_state_path=path / HF_STATE_FILE)
        if hasattr(model, "medusa_heads"):
            model.medusa_heads.load_state_dict(_hf_medusa_tensors(path), assign=True)
    else:
        raise MissingArtifactError(f"{path} holds no ModelOpt checkpoint ({SAVED_FILE} from mto.save, or "
                                   f"{HF_STATE_FILE} beside save_pretrained's weights)")
    if not isinstance(getattr(model, "medusa_heads", None), nn.ModuleList):
        raise ValueError(f"the ModelOpt checkpoint {path} holds no Medusa heads (was it converted with "
                         f"mtsp.convert(model, [('medusa', ...)])?)")
    return own_heads(model.medusa_heads), DraftVocabulary(target.get_output_embeddings())


def _hf_medusa_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The `medusa_heads.*` tensors of a save_pretrained folder (one or several safetensors shards), unprefixed."""
    from safetensors import safe_open

    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            tensors.update({key.removeprefix("medusa_heads."): f.get_tensor(key)
                            for key in f.keys() if key.startswith("medusa_heads.")})
    if not tensors:
        raise MissingArtifactError(f"{folder} has {HF_STATE_FILE} but no medusa_heads.* tensors in *.safetensors "
                                   f"(save it with save_pretrained(..., safe_serialization=True))")
    return tensors


class ModelOptMedusaRecipe(MedusaRecipe):
    """The Medusa recipe on ModelOpt's heads: `build` converts the target with mtsp.convert and trains
    `target.medusa_heads` through a shared-parameter MedusaHeads view; the loss is ModelOpt's (its forward with
    freeze_base_model=True: heads_coefficient x sum_k decay^k CE_k); `save` writes the converted model with mto.save."""

    def __init__(self, decay: float = 0.8, heads_coefficient: float = 0.2):
        super().__init__(decay)
        self.heads_coefficient = heads_coefficient
        self.model = None

    def build(self, target, tcfg) -> MedusaHeads:
        mtsp, _ = import_modelopt()
        self.model = mtsp.convert(target, medusa_config(tcfg.num_heads, tcfg.num_layers))
        return heads_view(self.model.medusa_heads)

    def loss(self, module, vocab, batch, target):
        loss, outputs = super().loss(module, vocab, batch, target)
        return self.heads_coefficient * loss, outputs

    def save(self, out_dir: Path, module: MedusaHeads, card: dict) -> None:
        _, mto = import_modelopt()
        out_dir.mkdir(parents=True, exist_ok=True)
        mto.save(self.model, out_dir / SAVED_FILE)
        card = {**card, "backend": "modelopt",
                "format": f"{SAVED_FILE}: mto.save of the target converted with mtsp.convert(model, "
                          f"{medusa_config(module.num_heads, len(module.blocks[0]))}) (nvidia-modelopt "
                          f"{_version()}), base weights included; load with mto.restore or "
                          f"method.drafter.checkpoint=<this folder>"}
        (out_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n")


def _version() -> str:
    from importlib.metadata import version

    return version("nvidia-modelopt")


def modelopt_run(cfg: DictConfig) -> TrainingRun:
    """The training run of `python -m bench.train method=medusa train.backend=modelopt`: writing to
    train.modelopt.out_dir (never over the native heads), resuming from train.modelopt.checkpoint, full-vocabulary
    heads; one line for a method or feature layers ModelOpt's Medusa cannot train, or ModelOpt missing (before
    the target loads)."""
    if cfg.method.name != "medusa":
        raise ConfigError(f"train.backend=modelopt trains Medusa only, not method={cfg.method.name}")
    if list(cfg.features.layers) != [-1]:
        raise ConfigError(f"features.layers={list(cfg.features.layers)}: ModelOpt's Medusa heads read the last "
                          f"hidden state; set features.layers=[-1]")
    import_modelopt()
    tcfg = cfg.train
    tcfg.draft_vocab_size = None  # ModelOpt's heads carry full-vocabulary projections of their own
    tcfg.out_dir = os.path.expanduser(tcfg.modelopt.out_dir)
    tcfg.checkpoint = os.path.expanduser(tcfg.modelopt.checkpoint)
    return TrainingRun.from_config(cfg)


def train_modelopt_medusa(run: TrainingRun) -> Path:
    """The shared trainer (methods/heads/training.py) with ModelOptMedusaRecipe on `run` (modelopt_run's)."""
    from methods.heads.training import train_heads

    return train_heads(run, ModelOptMedusaRecipe(run.train.config.recipe.decay))
