"""The one decode loop every method shares: propose a token tree, verify it in one target forward, accept, compact.

Step by step (gpt-fast's shape, generalised to trees):
  1. prefill the prompt; the target picks the first token (the root of the next tree);
  2. the drafter proposes a DraftTree under the root (or nothing: plain autoregressive decoding);
  3. one target forward over [root, nodes..., aux...] with tree attention and depth-based positions;
  4. the acceptance rule picks the longest valid path and the bonus token after it;
  5. the KV cache keeps the past, the root and the accepted nodes; the bonus token becomes the next root.

Each turn also says where its time went (`TurnOutput.phase_seconds`: prefill, draft, verify, accept; on CUDA the
device is synchronised at each boundary) and how many tokens each verification forward carried
(`TurnOutput.verified_tokens`), which the cost model (bench/costmodel.py) turns into a predicted speedup.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from bench.acceptance import Acceptance, greedy_accept, speculative_sampling_accept
from bench.kvcache import attention_windows, host_to_device, new_cache, tree_attention_mask
from bench.sampling import SamplingConfig, logits_to_probs, sample
from bench.timing import device_time
from bench.tree import DraftTree


@dataclass
class StepResult:
    """What a drafter learns after a verification step."""

    tree: DraftTree | None
    logits: torch.Tensor  # [L, vocab] target logits for root, nodes, aux nodes
    acceptance: Acceptance
    hidden: torch.Tensor | None = None  # [L, F] target features of the same rows, for drafters with feature_layers


class Drafter(Protocol):
    """A method's proposer. `context` is every token so far: prompt, generated tokens and the current root.

    A drafter that drafts from the target's own hidden states (Medusa, EAGLE, Hydra) sets `feature_layers`, indices
    into transformers' `hidden_states` (-1: the last layer after the final norm, what the LM head sees); the engine
    then hands it the target's features, concatenated over those layers, on the device and without a second
    forward: `start(prompt_ids, hidden=[P, F])` for the prompt and `StepResult.hidden` for each verified step.
    Drafters without `feature_layers` get neither and cost nothing extra.
    """

    def start(self, prompt_ids: list[int]) -> None: ...

    def propose(self, context: list[int], budget: int) -> DraftTree | None: ...

    def update(self, step: StepResult) -> None: ...


@dataclass
class StopCondition:
    """Stops exactly where vanilla decoding stops: an EOS token (kept), a stop string, or max_new_tokens."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    tokenizer: object = None

    def extend(self, generated: list[int], new_tokens: list[int]) -> bool:
        """Append new_tokens to generated up to the stopping point; True when generation is over."""
        for token in new_tokens:
            generated.append(token)
            if token in self.eos_token_ids or len(generated) >= self.max_new_tokens or self._hit_stop_string(generated):
                return True
        return False

    def _hit_stop_string(self, generated: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(generated[-16:])
        return any(s in tail for s in self.stop_strings)


PHASES = ("prefill", "draft", "verify", "accept")


class PhaseTimer:
    """Seconds per phase of a turn: `lap(phase)` charges the time since the previous lap to `phase`. On CUDA each
    lap synchronises the device, so a phase is charged for the GPU work it launched."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._last = device_time(device)

    def lap(self, phase: str) -> None:
        now = device_time(self.device)
        self.seconds[phase] += now - self._last
        self._last = now


@dataclass
class TurnOutput:
    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)  # tokens added per target forward (prefill included)
    verified_tokens: list[int] = field(default_factory=list)  # inputs of each decode step's forward (root + tree)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # PHASES -> seconds

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)


def keep_accepted_kv(cache: DynamicCache, past_len: int, rows: list[int]) -> None:
    """Keep past_len cached positions plus the step's inputs at `rows`, in that order; drop the rest."""
    kept = past_len + len(rows)
    if rows != list(range(len(rows))):
        index = host_to_device([past_len + row for row in rows], cache.layers[0].keys.device, torch.long)
        for layer in cache.layers:
            layer.keys[..., past_len:kept, :] = layer.keys[..., index, :]
            layer.values[..., past_len:kept, :] = layer.values[..., index, :]
    surplus = cache.get_seq_length() - kept
    if surplus:
        cache.crop(-surplus)


def pick_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> int:
    """The target's next token from its logits [vocab]: the argmax under greedy decoding, else a sample."""
    if sampling.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, sampling).cpu(), generator)


class NoDrafter:
    """Vanilla decoding: proposes nothing, so each step is one target forward for one token."""

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context: list[int], budget: int) -> DraftTree | None:
        return None

    def update(self, step: StepResult) -> None:
        pass


class SpeculativeEngine:
    """Runs draft-then-verify decoding of one prompt with any Hugging Face causal LM."""

    def __init__(self, model, drafter: Drafter | None = None, sampling: SamplingConfig = SamplingConfig()):
        self.model = model
        self.drafter = drafter or NoDrafter()
        self.sampling = sampling
        self.device = model.device
        self._windows = attention_windows(model)  # refuses models whose cache cannot be cut back
        self.feature_layers = tuple(getattr(self.drafter, "feature_layers", ()))

    def _forward(self, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target logits [L, vocab] and, when the drafter asks for them, its features [L, F] (batch row 0)."""
        if not self.feature_layers:
            return self.model(**inputs).logits[0], None
        out = self.model(**inputs, output_hidden_states=True)
        parts = [out.hidden_states[i][0] for i in self.feature_layers]
        return out.logits[0], parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _pick(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        return pick_token(logits, self.sampling, generator)

    def _accept(self, logits: torch.Tensor, tree: DraftTree | None, generator) -> Acceptance:
        if self.sampling.greedy:
            return greedy_accept(logits, tree)
        return speculative_sampling_accept(logits, tree, self.sampling, generator)

    def _verify_inputs(self, root: int, tree: DraftTree | None, past_len: int) -> dict:
        """input_ids, and for real trees explicit positions and 4-D additive masks [1, 1, L, past + L]; built on
        the device from the tree's cached device tensors, with no host sync."""
        if tree is None:
            return {"input_ids": host_to_device([[root]], self.device, torch.long)}
        inputs = {"input_ids": tree.input_ids(root, self.device)[None]}
        if not tree.is_chain:  # chains use the model's own causal mask
            local, offsets = tree.on_device(self.device)
            inputs["attention_mask"] = tree_attention_mask(local, offsets, past_len, self._windows,
                                                           self.model.dtype)
            inputs["position_ids"] = (offsets + past_len).unsqueeze(0)
        return inputs

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], stop: StopCondition, seed: int | None = None) -> TurnOutput:
        """Decode one prompt until `stop`; returns the new tokens and the tokens accepted per target forward."""
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        timer = PhaseTimer(self.device)
        cache = new_cache()
        prompt = torch.tensor([prompt_ids], device=self.device)
        logits, hidden = self._forward(input_ids=prompt, cache=cache, logits_to_keep=1)
        root = self._pick(logits[-1], generator)
        out = TurnOutput(tokens=[], accept_lengths=[1])
        done = stop.extend(out.tokens, [root])
        if hidden is None:
            self.drafter.start(list(prompt_ids))
        else:
            self.drafter.start(list(prompt_ids), hidden=hidden)
        context = list(prompt_ids) + [root]
        timer.lap("prefill")
        while not done:
            tree = self.drafter.propose(context, stop.max_new_tokens - len(out.tokens))
            if tree is not None and not len(tree) and not tree.aux_tokens:
                tree = None
            past_len = cache.get_seq_length()
            inputs = self._verify_inputs(root, tree, past_len)
            timer.lap("draft")
            logits, hidden = self._forward(**inputs, cache=cache)
            timer.lap("verify")
            acceptance = self._accept(logits, tree, generator)
            keep_accepted_kv(cache, past_len, acceptance.rows)
            self.drafter.update(StepResult(tree, logits, acceptance, hidden))
            before = len(out.tokens)
            done = stop.extend(out.tokens, acceptance.tokens)
            out.accept_lengths.append(len(out.tokens) - before)
            root = acceptance.tokens[-1]
            context.extend(acceptance.tokens)
            out.verified_tokens.append(inputs["input_ids"].shape[1])
            timer.lap("accept")
        out.phase_seconds = timer.seconds
        return out
