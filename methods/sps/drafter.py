"""SpS: speculative sampling with a separate draft model of the same tokenizer (Leviathan et al. 2023; Chen et al. 2023).

The draft model autoregresses a chain of γ tokens with its own KV cache; the shared engine verifies the chain in one
target forward and applies the shared acceptance rule (greedy match, or min(1, p/q) with residual resampling).
A draft is either any Hugging Face causal LM (e.g. `double7/vicuna-68m` for Vicuna) or a few of the target's own
layers distilled by `python -m bench.train method=sps`, stored without the embedding and LM head it shares with the
target (`slice_target`, `save_draft`, `load_draft`). Drafts load strictly: a tensor missing (which Hugging Face
would silently initialise at random), unexpected or of the wrong shape, or a weights file that cannot be read, is
refused in one line naming the draft and the fix.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from bench.engine.drafter import Drafter, StepResult
from bench.engine.kvcache import new_cache
from bench.errors import InvalidArtifactError, MissingArtifactError
from bench.artifacts import artifact_fingerprint, resolve_artifact_path
from bench.engine.sampling import SamplingConfig, logits_to_probs, sample
from bench.engine.tree import DraftTree
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
    shared = {id(p) for module in (draft.get_input_embeddings(), draft.get_output_embeddings()) for p in module.parameters()}
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


resolve_draft_path = resolve_artifact_path  # a local draft folder, or None for a hub id


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
                                   f"or set model.sps_draft to a local copy") from err
    if draft.config.vocab_size != target.config.vocab_size:
        raise InvalidArtifactError(f"SpS draft '{source}' has a vocabulary of {draft.config.vocab_size} tokens, the "
                                   f"target {target.config.vocab_size}; set model.sps_draft to a draft with the "
                                   f"target's tokenizer")
    return draft.to(target.device).eval()


def _pretrained_strictly(source: str, dtype: torch.dtype, train_command: str):
    """AutoModelForCausalLM.from_pretrained, refusing in one line what it would only log: missing tensors (it
    initialises them at random), unexpected and mis-shaped ones; and an unreadable weights file."""
    fix = (f"download the draft again (huggingface-cli download <hub id>), set model.sps_draft to a complete copy, "
           f"or make one with: {train_command}")
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


class DraftModelDrafter(Drafter):
    """Proposes a chain of `num_draft_tokens` (γ) tokens sampled (or, under greedy, argmax-picked) from the draft.

    Spec-Bench ran transformers 4.36's assisted generation, whose defaults were γ = 5 and the "heuristic" schedule;
    `adaptive` is that schedule (γ + 2 after a fully accepted chain, else γ - 1, at least 1), reset every turn.
    `sampling` must be the run's SamplingConfig so that q is processed like p; without it the draft proposes its
    argmax with q = None, which the acceptance rule treats as a deterministic (still lossless) proposal.
    """

    samples = True

    def __init__(self, target, tokenizer=None, draft_path: str | None = None, num_draft_tokens: int = 5,
                 adaptive: bool = True, sampling: SamplingConfig | None = None, seed: int | None = None,
                 draft_model=None, train_command: str = "python -m bench.train method=sps"):
        self.draft = draft_model if draft_model is not None else load_draft(draft_path, target, train_command)
        # Identifies the weights in run keys (None for a model passed in).
        self.artifact = artifact_fingerprint(resolve_draft_path(draft_path) or draft_path) if draft_model is None else None
        self.initial_draft_tokens = self.num_draft_tokens = num_draft_tokens
        self.adaptive = adaptive
        self.sampling = sampling or SamplingConfig()
        self.fallback_seed, self.generator = seed, None  # start() seeds the generator for each turn
        self.cache: DynamicCache | None = None
        self._base = 0  # len(context) at the last proposal: the cache length to keep before accepted drafts

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], seed: int | None = None) -> None:
        """A fresh draft cache and γ; the draws come from `seed` (the engine's drafter seed for this turn), or, when
        the turn has none, from the constructor's `seed` (None: torch's global generator)."""
        seed = self.fallback_seed if seed is None else seed
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.num_draft_tokens = self.initial_draft_tokens
        self.cache = new_cache()
        self._base = len(prompt_ids)  # the cache to keep should an update come before any proposal
        self.draft(input_ids=torch.tensor([prompt_ids], device=self.draft.device), cache=self.cache, logits_to_keep=1)

    @torch.inference_mode()
    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self._base = len(context)
        n = min(self.num_draft_tokens, max_tokens - 1)  # a step adds accepted drafts + 1 bonus token
        if n <= 0:
            return None
        # the root, plus the last chain's final draft if all were kept
        ids = torch.tensor([context[self.cache.get_seq_length():]], device=self.draft.device)
        drafted, probs = [], []
        for _ in range(n):
            logits = self.draft(input_ids=ids, cache=self.cache, logits_to_keep=1).logits[0, -1]  # [vocab]
            if self.sampling.greedy:  # stays on the device: one host sync per chain, not per token
                ids = logits.argmax().view(1, 1)
            else:  # the sampler's generator lives on the CPU
                q = logits_to_probs(logits, self.sampling).cpu()  # [vocab]
                ids = torch.tensor([[sample(q, self.generator)]], device=self.draft.device)
                probs.append(q)
            drafted.append(ids)
        return DraftTree.chain(torch.cat(drafted).flatten().tolist(), torch.stack(probs) if probs else None)

    def update(self, step: StepResult) -> None:
        accepted = step.acceptance.num_accepted_drafts
        surplus = self.cache.get_seq_length() - (self._base + accepted)  # cache keeps context + accepted drafts
        if surplus > 0:
            self.cache.crop(-surplus)
        if self.adaptive and step.tree is not None and len(step.tree):
            full = accepted == len(step.tree)
            self.num_draft_tokens = self.num_draft_tokens + 2 if full else max(1, self.num_draft_tokens - 1)
