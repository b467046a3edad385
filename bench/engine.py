"""The one decode loop every method shares: propose a token tree, verify it in one target forward, accept, compact.

Step by step (gpt-fast's shape, generalised to trees):
  1. prefill the prompt; the target picks the first token (the root of the next tree);
  2. the drafter proposes a DraftTree under the root (or nothing: plain autoregressive decoding);
  3. one target forward over [root, nodes..., aux...] with tree attention and depth-based positions;
  4. the acceptance rule picks the longest valid path and the bonus token after it;
  5. the KV cache keeps the past, the root and the accepted nodes; the bonus token becomes the next root.

Each turn also says where its time went (`TurnOutput.phase_seconds`: prefill, draft, verify, accept; on CUDA from
events recorded at each boundary and read after the turn, see PhaseTimer) and how many tokens each verification
forward carried (`TurnOutput.verified_tokens`), which the cost model (bench/costmodel.py) turns into a predicted
speedup.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from bench.acceptance import Acceptance, greedy_accept, speculative_sampling_accept
from bench.kvcache import attention_windows, host_to_device, new_cache, tree_attention_mask
from bench.sampling import SamplingConfig, logits_to_probs, sample
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

    A drafter that draws random numbers (SpS, EAGLE under sampling) takes a `seed` keyword in start(): the engine
    passes `drafter_seed(turn seed)`, a value derived from the seed the turn is decoded with and apart from the
    engine's own acceptance stream, or None when the turn has no seed. The drafter seeds its own generator with it at
    every start(), so a turn's drafts depend on that turn's seed alone: the same seed gives the same tokens on a
    repeat, in any question order, and in every row of a batch (each row gets its own row's seed).
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


Clock = Callable[[], float]  # seconds, from any fixed origin


def drafter_seed(seed: int | None) -> int | None:
    """The seed of a drafter's own random stream in a turn decoded with `seed` (None: none): a hash of it, so that
    the drafter's draws are apart from the engine's acceptance stream (seeded with `seed` itself) and from every
    other turn's."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"drafter stream {seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # < 2**63: any torch or numpy generator takes it


def start_drafter(drafter, prompt_ids: list[int], hidden: torch.Tensor | None, seed: int | None) -> None:
    """drafter.start() with what the Drafter contract gives it: features when it has `feature_layers` (`hidden` not
    None), and `seed` (already a drafter seed) when its start() takes one."""
    extra = {} if hidden is None else {"hidden": hidden}
    if "seed" in inspect.signature(drafter.start).parameters:
        extra["seed"] = seed
    drafter.start(list(prompt_ids), **extra)


class PhaseTimer:
    """Seconds per phase of a turn: `lap(phase)` charges the time since the previous lap to `phase`; `seconds`
    (read once the turn is over) sums them.

    On CUDA (or with `event` given) each lap records an event on the current stream, `event()` returning an object
    like torch.cuda.Event(enable_timing=True): record(), synchronize(), elapsed_time(other) in ms. Nothing waits for
    the device during the turn; `seconds` waits for the last event once and reads the gaps, so a phase is charged
    for the device time between its boundaries. Elsewhere each lap reads `clock` (default time.perf_counter), which
    tests replace with a fake clock. `mark()` and `since_start(mark)` time other moments of the turn the same way."""

    def __init__(self, device: torch.device, clock: Clock | None = None, event: Callable | None = None):
        if event is None and clock is None and device.type == "cuda":
            event = functools.partial(torch.cuda.Event, enable_timing=True)
        self.clock, self.event = clock or time.perf_counter, event
        self._laps: list[tuple[str, object]] = []
        self._latest = self._start = self.mark()

    def mark(self):
        """A stamp of now: a clock reading, or a recorded event."""
        if self.event is None:
            stamp = self.clock()
        else:
            stamp = self.event()
            stamp.record()
        self._latest = stamp
        return stamp

    def lap(self, phase: str) -> None:
        self._laps.append((phase, self.mark()))

    def _between(self, begin, end) -> float:
        return end - begin if self.event is None else begin.elapsed_time(end) / 1e3

    def _wait(self) -> None:
        if self.event is not None:
            self._latest.synchronize()

    def since_start(self, stamp) -> float:
        """Seconds from the timer's start to `stamp` (call after the turn)."""
        self._wait()
        return self._between(self._start, stamp)

    @property
    def seconds(self) -> dict[str, float]:
        """PHASES -> seconds charged so far (call after the turn: on CUDA it waits for the device)."""
        self._wait()
        seconds, last = dict.fromkeys(PHASES, 0.0), self._start
        for phase, stamp in self._laps:
            seconds[phase] += self._between(last, stamp)
            last = stamp
        return seconds


@dataclass
class TurnOutput:
    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)  # tokens added per target forward (prefill included)
    verified_tokens: list[int] = field(default_factory=list)  # inputs of each decode step's forward (root + tree)
    tree_steps: list[bool] = field(default_factory=list)  # per decode step: its forward took a tree mask
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

    def __init__(self, model, drafter: Drafter | None = None, sampling: SamplingConfig = SamplingConfig(),
                 clock: Clock | None = None, event: Callable | None = None):
        self.model = model
        self.drafter = drafter or NoDrafter()
        self.sampling = sampling
        self.clock, self.event = clock, event  # the phase timer's (PhaseTimer); tests inject fakes
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
        timer = PhaseTimer(self.device, self.clock, self.event)
        cache = new_cache()
        prompt = torch.tensor([prompt_ids], device=self.device)
        logits, hidden = self._forward(input_ids=prompt, cache=cache, logits_to_keep=1)
        root = self._pick(logits[-1], generator)
        out = TurnOutput(tokens=[], accept_lengths=[1])
        done = stop.extend(out.tokens, [root])
        start_drafter(self.drafter, prompt_ids, hidden, drafter_seed(seed))
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
            out.tree_steps.append("attention_mask" in inputs)  # the profile's tree point, not its chain point
            timer.lap("accept")
        out.phase_seconds = timer.seconds
        return out
