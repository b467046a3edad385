"""The one training loop of the trained-head drafters (Medusa, EAGLE, Hydra), and `train_heads`, which runs the stages:

    python -m bench.train method=<medusa|eagle|hydra> [model=<model>] [train.<key>=...]

1. answers (features.source=self_distill only; methods/heads/self_distill.py): the target's own greedy answers to
   ShareGPT first turns, handed on as training sequences;
2. the feature cache (methods/heads/features.py): those sequences, or ShareGPT's, with the target's features and
   own next-token predictions, cached once and handed on as `Features`;
3. the training loop (here): the method's head module and loss (its `recipe`, e.g. methods.medusa.train.MedusaRecipe)
   trained with the target frozen -> a checkpoint folder with a card.json.

Each stage reads its typed settings (methods/heads/settings.py), made and checked once by the training command
(bench/train.py, `TrainingRun.from_config`) and handed to `train_heads`, and none calls back into an earlier one.
Training runs in stints of `train.minutes`:

- `train.resume=false` (default): a new head from scratch, written over `train.out_dir`.
- `train.resume=true`: the committed head in `train.out_dir` trained on for another stint. With the optimizer state
  saved beside it (`<out_dir>/train_state/optimizer.pt`, written at the end of every stint, not committed) whose
  float32 weights round to the committed ones, training continues with it; otherwise a warm restart (the committed
  weights, a fresh AdamW, `train.warmup_steps` of warm-up). The card says which.
- `train.minutes=0`: nothing is trained or written; the committed head's held-out agreement is printed.

Within a stint, a crash-resume file (`train.checkpoint`, every `train.checkpoint_minutes`) lets the same command,
rerun after an interruption, continue the stint where it stopped; it is removed when the stint's artifact is
written. card.json lists every stint (`stints`: commands, start, minutes, tokens, steps, dtype, data, date, losses,
held-out agreement per head / draft depth) and the cumulative `train_minutes`, `tokens_seen` and `steps`.

Forwards and losses run under autocast in `train.dtype` (auto: bfloat16 where the CPU has AMX / AVX512-BF16, or on a
GPU that supports it; float32 otherwise); parameters, AdamW state and the loss itself stay float32. Held-out
agreement is always evaluated in float32, as the drafters run.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from torch import nn

from bench.artifacts import artifact_fingerprint
from bench.errors import ConfigError, MissingArtifactError
from bench.models import BFLOAT16_CPU_FLAGS, bfloat16_flags, cpu_bfloat16_support, load_model
from methods.heads.common import (
    DraftVocabulary,
    load_strictly,
    most_frequent_tokens,
    read_heads,
    read_json,
    save_atomically,
    save_heads,
)
from methods.heads.features import Features, build_feature_cache, data_record, load_features, sharegpt_sequences
from methods.heads.self_distill import answer_sequences
from methods.heads.settings import FeatureSettings, StintSettings, TrainingRun, TrainSettings

HeadOutputs = list[tuple[torch.Tensor, torch.Tensor]]  # per head: (logits [N, V'], target slice positions [N])
TRAIN_STATE = Path("train_state") / "optimizer.pt"  # beside the artifact; a folder, so not in its fingerprint


class Recipe(Protocol):
    """What a trained-head method contributes: its module, its loss, and how it is stored."""

    method: str

    def build(self, target, tcfg: DictConfig) -> nn.Module: ...

    def loss(self, module: nn.Module, vocab: DraftVocabulary, batch: Features,
             target) -> tuple[torch.Tensor, HeadOutputs]: ...

    def checkpoint_config(self, module: nn.Module, tcfg: DictConfig) -> dict: ...

    # Optional (EAGLE-3's recipe has them): `feature_layers(target)`, the target layers the cache must store (they
    # replace features.layers); `set_vocabulary(module, ids)` / `vocabulary_ids(module)`, for a module that holds its
    # draft vocabulary itself (d2t / t2d), so the checkpoint carries no `draft_vocab_ids`; `save(out_dir, module,
    # card)`, a checkpoint format of its own (not continued by train.resume=true).


def training_dtype(setting: str | None, device: torch.device, cpuinfo: str | None = None) -> torch.dtype:
    """The autocast dtype of `train.dtype`: auto = bfloat16 where the hardware has it (else float32, said once on
    stderr), or bfloat16 / float32 as given."""
    setting = setting or "float32"  # one of AUTOCAST_DTYPES (TrainingRun.from_config checked it)
    if setting != "auto":
        return getattr(torch, setting)
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
    else:
        supported = device.type == "cpu" and bool(cpu_bfloat16_support() if cpuinfo is None
                                                  else bfloat16_flags(cpuinfo))
    if supported:
        return torch.bfloat16
    print(f"note: training in float32: this {device.type} has no bfloat16 matrix instructions "
          f"({' / '.join(BFLOAT16_CPU_FLAGS)} not in /proc/cpuinfo); train.dtype=bfloat16 forces autocast",
          file=sys.stderr)
    return torch.float32


def autocast(dtype: torch.dtype, device: torch.device):
    """torch.autocast in `dtype` on the device's type; a no-op for float32."""
    return torch.autocast(device.type, dtype=dtype if dtype != torch.float32 else torch.bfloat16,
                          enabled=dtype != torch.float32)


def learning_rate(schedule: StintSettings, step: int, progress: float) -> float:
    """Linear warm-up over `schedule.warmup_steps`, then cosine from `schedule.lr` down to a tenth of it as progress
    (the larger of the step and time fractions) -> 1."""
    if step < schedule.warmup_steps:
        return schedule.lr * (step + 1) / schedule.warmup_steps
    return schedule.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def batch_on(features: Features, index: torch.Tensor, device: torch.device) -> Features:
    """Rows `index` of a feature set on `device`, features as float32."""
    soft = {} if features.soft_ids is None else {"soft_ids": features.soft_ids[index].to(device),
                                                 "soft_logprobs": features.soft_logprobs[index].to(device)}
    return Features(features.input_ids[index].to(device), features.hidden[index].to(device, torch.float32),
                    features.labels[index].to(device), features.mask[index].to(device), **soft)


def train_step(recipe: Recipe, module: nn.Module, vocab: DraftVocabulary, batch: Features, target, optimizer,
               lr: float, grad_clip: float, dtype: torch.dtype) -> float:
    """One AdamW step on `batch`: the recipe's forward and loss under autocast in `dtype`, the loss and backward in
    float32 weights; returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast(dtype, batch.hidden.device):
        loss, _ = recipe.loss(module, vocab, batch, target)
    optimizer.zero_grad(set_to_none=True)
    loss.float().backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


@torch.no_grad()
def heldout_agreement(recipe: Recipe, module: nn.Module, vocab: DraftVocabulary, heldout: Features, target,
                      chunk: int = 8) -> list[dict]:
    """Per head (for EAGLE: per draft depth): the fraction of held-out assistant positions where the target's next
    token is the head's top-1 / in its top-5 (a token outside the draft vocabulary counts as a miss); float32."""
    module.eval()
    hits: list[list[float]] = []
    for start in range(0, len(heldout), chunk):
        _, outputs = recipe.loss(module, vocab, batch_on(heldout, torch.arange(start, min(start + chunk, len(heldout))),
                                                         vocab.weight.device), target)
        for k, (logits, targets) in enumerate(outputs):
            if len(hits) <= k:
                hits.append([0.0, 0.0, 0.0])
            top5 = logits.topk(5, dim=-1).indices
            hits[k][0] += float((top5[:, 0] == targets).sum())
            hits[k][1] += float((top5 == targets[:, None]).any(-1).sum())
            hits[k][2] += len(targets)
    module.train()
    depth = getattr(recipe, "per_depth", False)
    return [{"head": k, **({"depth": k + 1} if depth else {}), "top1": round(t1 / max(n, 1), 4),
             "top5": round(t5 / max(n, 1), 4), "positions": int(n)} for k, (t1, t5, n) in enumerate(hits)]


def train_heads(run: TrainingRun, recipe: Recipe) -> Path:
    """One training stint of a method's heads, stage by stage (see the module docstring); with train.minutes=0 the
    committed head evaluated instead. Returns the checkpoint folder."""
    features, settings = run.features, run.train
    torch.manual_seed(settings.seed)
    target, tokenizer = load_model(run.model, torch.device(settings.device))
    target.requires_grad_(False)
    if hasattr(recipe, "feature_layers"):  # EAGLE-3: the three target layers its head fuses
        features = replace(features, layers=tuple(recipe.feature_layers(target)))
    evaluating = settings.minutes == 0  # nothing trained or written: the held-out shards are all it needs
    dtype = None if evaluating else stint_dtype(recipe, settings)  # a stint that cannot run is refused first
    soft_top_k = 0 if evaluating else getattr(recipe, "soft_top_k", 0)
    if features.answers is not None:  # 1. the target's own answers, generated when the cache first reads one
        sequences = answer_sequences(target, tokenizer, features.answers, features.seq_len)
    else:
        sequences = sharegpt_sequences(tokenizer, features)
    build_feature_cache(target, sequences, features, evaluating, soft_top_k)  # 2. the feature cache
    train_set, heldout = load_features(features, evaluating, soft_top_k)
    if evaluating:
        return evaluate_committed(recipe, target, heldout, features, settings)
    return train_stint(recipe, target, tokenizer, train_set, heldout, features, settings, dtype)  # 3. training


def stint_dtype(recipe: Recipe, settings: TrainSettings) -> torch.dtype:
    """The stint's autocast dtype (train.dtype), once a stint that cannot run is refused."""
    if settings.resume and hasattr(recipe, "save"):
        raise ConfigError(f"train.resume=true continues this project's own head format, not {type(recipe).__name__}'s; "
                          f"set train.resume=false")
    return training_dtype(settings.dtype, torch.device(settings.device))


def train_stint(recipe: Recipe, target, tokenizer, train_set: Features, heldout: Features, features: FeatureSettings,
                settings: TrainSettings, dtype: torch.dtype) -> Path:
    """The training stage: one stint on the cached features (a fresh head, or the committed one with train.resume),
    its card and checkpoint written; returns the checkpoint folder."""
    module = recipe.build(target, settings.config).to(torch.device(settings.device))
    committed = load_committed(settings.out_dir, recipe, module, settings.config) if settings.resume else None
    vocab_ids = committed["vocab_ids"] if committed else draft_vocabulary_ids(settings, train_set, target, tokenizer)
    if committed is None and hasattr(recipe, "set_vocabulary"):  # a module that holds its vocabulary (EAGLE-3)
        recipe.set_vocabulary(module, vocab_ids)
    vocab = DraftVocabulary(target.get_output_embeddings(), vocab_ids)
    optimizer = torch.optim.AdamW(module.parameters(), lr=settings.lr, betas=settings.betas,
                                  weight_decay=settings.weight_decay)
    state = start_stint(recipe, module, optimizer, committed, settings)
    state["commands"].append("python -m bench.train " + " ".join(sys.argv[1:]))
    state["dtype"] = str(dtype).removeprefix("torch.")
    save_checkpoint = crash_checkpoint_writer(settings.checkpoint, state, module, optimizer)
    run = HeadTraining(settings, recipe, module, vocab, target, optimizer, state, dtype)
    started = run.steps(train_set, heldout, save_checkpoint)
    final = heldout_agreement(recipe, module, vocab, heldout, target)
    state["wall_seconds"] += time.time() - started
    save_checkpoint()
    covered = heldout.labels[heldout.mask]
    coverage = 1.0 if vocab_ids is None else float(torch.isin(covered, vocab_ids.cpu()).float().mean())
    card = heads_card(recipe, settings, features, state, vocab, coverage, final, len(train_set), len(heldout))
    write_heads(settings.out_dir, recipe, module, vocab_ids, card, settings.config)
    if not hasattr(recipe, "save"):  # a format of its own is not continued (train.resume=true refuses it)
        save_train_state(settings.out_dir, module, optimizer)
    settings.checkpoint.unlink(missing_ok=True)  # the stint is over: a rerun starts the next one
    print(json.dumps({k: card[k] for k in ("steps", "train_minutes", "tokens_seen", "final_loss", "draft_vocab_size",
                                           "heldout_vocab_coverage", "heldout_agreement")}))
    print(f"{recipe.method} heads saved to {settings.out_dir} (stint {len(card['stints'])}: {state['start']})")
    return settings.out_dir


def draft_vocabulary_ids(settings: TrainSettings, train_set: Features, target, tokenizer) -> torch.Tensor | None:
    """A fresh head's draft vocabulary: the `train.draft_vocab_size` labels most frequent in the training set."""
    if not settings.draft_vocab_size:
        return None
    return most_frequent_tokens(train_set.labels[train_set.mask], settings.draft_vocab_size,
                                target.get_output_embeddings().weight.shape[0], tokenizer.all_special_ids)


def write_heads(out_dir: Path, recipe: Recipe, module: nn.Module, vocab_ids, card: dict, tcfg: DictConfig) -> None:
    if hasattr(recipe, "save"):  # a recipe with a format of its own (methods/medusa/modelopt.py: mto.save)
        recipe.save(out_dir, module, card)
        return
    in_module = vocab_ids is None or hasattr(recipe, "vocabulary_ids")  # EAGLE-3's d2t / t2d are module buffers
    weights = {**module.state_dict(), **({} if in_module else {"draft_vocab_ids": vocab_ids})}
    save_heads(out_dir, {"specbench_method": recipe.method, **recipe.checkpoint_config(module, tcfg)}, weights, card)


def load_committed(out_dir: Path, recipe: Recipe, module: nn.Module, tcfg: DictConfig) -> dict:
    """The committed head in `out_dir` loaded into `module`: {"vocab_ids", "card", "tensors" (as stored),
    "fingerprint"}; one line when there is none or its shape is not the recipe's."""
    command = f"python -m bench.train method={recipe.method}"
    if not (out_dir / "config.json").exists():
        raise MissingArtifactError(f"train.resume=true continues the committed {recipe.method} head, but {out_dir} "
                                   f"holds none; train one first with: {command} train.resume=false")
    config, tensors = read_heads(out_dir, recipe.method, command)
    wanted = recipe.checkpoint_config(module, tcfg)
    differ = {key: config.get(key) for key, value in wanted.items() if config.get(key) != value}
    if differ:
        raise ConfigError(f"the committed head in {out_dir} has {differ}, this recipe {wanted}; continue it with "
                          + " ".join(f"train.{key}={value}" for key, value in differ.items()))
    vocab_ids = tensors.pop("draft_vocab_ids", None)
    load_strictly(module, tensors, out_dir / "model.safetensors", f"remake it with: {command} train.resume=false")
    if hasattr(recipe, "vocabulary_ids"):
        vocab_ids = recipe.vocabulary_ids(module)
    return {"vocab_ids": vocab_ids, "card": read_json(out_dir / "card.json", "fix or remove it"), "tensors": tensors,
            "fingerprint": artifact_fingerprint(out_dir)}


def new_state(base: str | None, method: str, earlier: list[dict], start: str) -> dict:
    """The state of a stint about to begin (what the crash-resume file holds besides the weights)."""
    return {"method": method, "base": base, "earlier": earlier, "start": start, "step": 0, "train_seconds": 0.0,
            "wall_seconds": 0.0, "losses": [], "evals": [], "commands": []}


def start_stint(recipe: Recipe, module: nn.Module, optimizer, committed: dict | None, settings: TrainSettings) -> dict:
    """The stint's state, its weights and optimizer in place: an interrupted stint of the same start continued from
    the crash-resume file; else from scratch, or (committed) the saved optimizer state when it matches the committed
    weights, else a warm restart."""
    base, checkpoint_path = committed["fingerprint"] if committed else None, settings.checkpoint
    saved = torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists() else None
    if saved is not None and saved.get("method") == recipe.method and "earlier" in saved and saved["base"] == base:
        module.load_state_dict(saved.pop("module"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        print(f"continuing the interrupted stint in {checkpoint_path} at step {saved['step']} "
              f"({saved['train_seconds'] / 60:.1f} min trained; delete it to start the stint over)")
        return saved
    if committed is None:
        return new_state(None, recipe.method, [], "scratch")
    earlier = earlier_stints(committed["card"])
    match = matching_train_state([settings.out_dir / TRAIN_STATE, checkpoint_path], committed["tensors"])
    if match is None:
        start = (f"warm restart from the committed head (its fp16 weights; fresh AdamW, {settings.warmup_steps} "
                 f"warm-up steps)")
    else:
        path, state = match
        module.load_state_dict(state["module"])
        optimizer.load_state_dict(state["optimizer"])
        start = f"continued from the committed head with its saved float32 weights and AdamW state ({path.name})"
    print(f"{recipe.method}: {start}; {sum(s.get('minutes') or 0 for s in earlier):.1f} min in earlier stints")
    return new_state(base, recipe.method, earlier, start)


def matching_train_state(candidates: list[Path], committed: dict[str, torch.Tensor]) -> tuple[Path, dict] | None:
    """The first saved training state (module + optimizer) whose weights, cast to the stored dtype, equal the
    committed tensors exactly; None when none does."""
    for path in candidates:
        if not path.exists():
            continue
        state = torch.load(path, weights_only=False, map_location="cpu")
        weights = state.get("module") if isinstance(state, dict) else None
        if weights is None or "optimizer" not in state or set(weights) != set(committed):
            continue
        if all(torch.equal(weights[key].to(value.dtype), value) for key, value in committed.items()):
            return path, state
    return None


def save_train_state(out_dir: Path, module: nn.Module, optimizer) -> None:
    """The float32 weights and AdamW state beside the artifact, for the next stint (`train.resume=true`)."""
    path = out_dir / TRAIN_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomically({"module": module.state_dict(), "optimizer": optimizer.state_dict()}, path)


def crash_checkpoint_writer(path: Path, state: dict, module: nn.Module, optimizer):
    """A function that writes the stint's crash-resume file (state, weights, optimizer) atomically."""
    def save() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_atomically({**state, "module": module.state_dict(), "optimizer": optimizer.state_dict()}, path)

    return save


def earlier_stints(card: dict) -> list[dict]:
    """The stints of a committed card; a card from before stints were recorded is one stint made of its history."""
    if not card:
        return []
    if "stints" in card:
        return list(card["stints"])
    recipe = card.get("recipe") or {}
    data = card.get("data")
    seq_len = data.get("seq_len") if isinstance(data, dict) else recipe.get("seq_len", 0)
    steps = card.get("steps", 0)
    return [{"commands": card.get("commands", []),
             "start": "recorded before stints were (its commands continued one schedule from scratch)",
             "minutes": card.get("train_minutes"), "wall_minutes": card.get("wall_minutes"),
             "tokens": card.get("tokens_seen") or steps * recipe.get("batch_size", 0) * (seq_len or 0),
             "steps": steps, "dtype": recipe.get("dtype") or recipe.get("autocast") or "float32",
             "data": data, "date": card.get("date"), "first_loss": card.get("first_loss"),
             "final_loss": card.get("final_loss"),
             "heldout_agreement": card.get("heldout_agreement") or card.get("mean_accepted_tokens")}]


def stint_record(state: dict, tokens: int, data, final) -> dict:
    """What card.json's `stints` records of the stint just run."""
    tail = state["losses"][-20:]
    return {"commands": state["commands"], "start": state["start"], "minutes": round(state["train_seconds"] / 60, 2),
            "wall_minutes": round(state["wall_seconds"] / 60, 2), "tokens": tokens, "steps": state["step"],
            "dtype": state.get("dtype", "float32"), "data": data,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "first_loss": state["losses"][0] if state["losses"] else None,
            "final_loss": round(sum(tail) / len(tail), 4) if tail else None, "heldout_agreement": final}


def cumulative(stints: list[dict]) -> dict:
    """card.json's totals over all stints."""
    return {"train_minutes": round(sum(s.get("minutes") or 0 for s in stints), 2),
            "wall_minutes": round(sum(s.get("wall_minutes") or 0 for s in stints), 2),
            "tokens_seen": sum(s.get("tokens") or 0 for s in stints), "steps": sum(s.get("steps") or 0 for s in stints),
            "commands": [c for s in stints for c in s.get("commands", [])]}


@torch.no_grad()
def evaluate_committed(recipe: Recipe, target, heldout: Features, features: FeatureSettings,
                       settings: TrainSettings) -> Path:
    """`train.minutes=0`: the committed head's held-out agreement, printed; nothing trained or written (but the
    held-out feature shards when missing)."""
    module = recipe.build(target, settings.config).to(target.device)
    committed = load_committed(settings.out_dir, recipe, module, settings.config)
    vocab = DraftVocabulary(target.get_output_embeddings(), committed["vocab_ids"])
    agreement = heldout_agreement(recipe, module, vocab, heldout, target)
    print(json.dumps({"checkpoint": str(settings.out_dir), "feature_cache": str(features.folder),
                      "heldout_sequences": len(heldout), "heldout_agreement": agreement}))
    return settings.out_dir


class HeadTraining:
    """The optimizer loop of train_heads over one module, its vocabulary, the frozen target and the state it grows."""

    def __init__(self, settings: TrainSettings, recipe: Recipe, module: nn.Module, vocab: DraftVocabulary, target,
                 optimizer, state: dict, dtype: torch.dtype = torch.float32):
        self.settings, self.recipe, self.module, self.vocab, self.target = settings, recipe, module, vocab, target
        self.optimizer, self.state, self.dtype = optimizer, state, dtype

    def steps(self, train_set: Features, heldout: Features, save_checkpoint) -> float:
        """Steps until train.max_steps or the stint's minutes, evaluating every train.eval_every steps and
        checkpointing every train.checkpoint_minutes; returns when the current wall-time stretch began."""
        from tqdm import tqdm

        settings, state = self.settings, self.state
        budget, started, last_save = settings.minutes * 60, time.time(), time.time()
        offset = sum(s.get("steps") or 0 for s in state["earlier"])  # earlier stints' batches are not repeated
        order = torch.Generator().manual_seed(settings.seed)
        bar = tqdm(total=settings.max_steps, initial=state["step"], desc=f"{self.recipe.method} heads", unit="step",
                   bar_format="{desc}: step {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")
        self.module.train()
        while state["step"] < settings.max_steps and state["train_seconds"] < budget:
            tick = time.time()
            order.manual_seed(settings.seed * 100003 + offset + state["step"])  # the same batches after a crash-resume
            batch = batch_on(train_set, torch.randint(len(train_set), (settings.batch_size,), generator=order),
                             torch.device(settings.device))
            self.step(batch, max(state["step"] / settings.max_steps, state["train_seconds"] / budget))
            state["train_seconds"] += time.time() - tick
            bar.update(1)
            bar.set_postfix(loss=f"{state['losses'][-1]:.3f}", min_left=f"{(budget - state['train_seconds']) / 60:.1f}")
            if state["step"] % settings.eval_every == 0:
                heads = heldout_agreement(self.recipe, self.module, self.vocab, heldout, self.target)
                state["evals"].append({"step": state["step"], "heads": heads})
                bar.write(f"step {state['step']}: held-out top-1 per head {[h['top1'] for h in heads]}")
            if time.time() - last_save > settings.checkpoint_minutes * 60:
                state["wall_seconds"] += time.time() - started
                started = last_save = time.time()
                save_checkpoint()
        bar.close()
        return started

    def step(self, batch, progress: float) -> None:
        """One optimizer step on `batch` at the schedule's `progress`; its loss appended to the state."""
        settings, state = self.settings, self.state
        loss = train_step(self.recipe, self.module, self.vocab, batch, self.target, self.optimizer,
                          learning_rate(settings, state["step"], progress), settings.grad_clip, self.dtype)
        state["step"] += 1
        state["losses"].append(round(loss, 4))


def heads_card(recipe: Recipe, settings: TrainSettings, features: FeatureSettings, state: dict, vocab: DraftVocabulary,
               coverage: float, final: list, train_sequences: int, heldout_sequences: int) -> dict:
    """card.json of trained heads: every stint, the totals, this stint's data, loss and held-out agreement, recipe,
    machine."""
    data = data_record(features, train_sequences, heldout_sequences, getattr(recipe, "soft_top_k", 0))
    if target := getattr(recipe, "target_record", lambda: None)():
        data["soft_targets"] = target
    this = stint_record(state, state["step"] * settings.batch_size * features.seq_len, data, final)
    stints = [*state["earlier"], this]
    return {
        "method": recipe.method,
        "target": {"name": features.model["name"], "source": features.model["gguf_file"] or features.model["path"]},
        **cumulative(stints),
        "stints": stints,
        "data": data,
        "first_loss": this["first_loss"],
        "final_loss": this["final_loss"],
        "draft_vocab_size": vocab.size,
        "heldout_vocab_coverage": round(coverage, 4),
        "heldout_agreement": final,
        "heldout_agreement_history": state["evals"],
        "recipe": OmegaConf.to_container(settings.config, resolve=True),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                   f"transformers {transformers.__version__}",
        "date": this["date"],
    }
