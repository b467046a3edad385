"""The one decode loop every method shares: propose a token tree, verify it in one target forward, accept, compact.

Step by step (gpt-fast's shape, generalised to trees):
  1. prefill the prompt; the target picks the first token (the root of the next tree);
  2. the drafter proposes a DraftTree under the root (or nothing: plain autoregressive decoding);
  3. one target forward over [root, nodes..., aux...] with tree attention and depth-based positions;
  4. the acceptance rule picks the longest valid path and the bonus token after it;
  5. the KV cache keeps the past, the root and the accepted nodes; the bonus token becomes the next root.

Each turn also says where its time went (`TurnOutput.phase_seconds`: prefill, draft, verify, accept; on CUDA from
events recorded at each boundary and read after the turn, see PhaseTimer) and how many tokens each verification
forward carried (`TurnOutput.verified_tokens`), which the cost model (bench/planning/costmodel.py) turns into a
predicted speedup.

The batched engine (bench/engine/batched.py) runs the same steps for B rows and shares their code with this one:
`target_forward` (logits and the drafter's features), `open_turn` and `record_step` (a row's bookkeeping),
`real_tree` and `start_drafter` (bench/engine/drafter.py); what differs is only what B rows need (one padded
forward, per-row masks and acceptance, a batch cache).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bench.engine.acceptance import Acceptance, greedy_accept, speculative_sampling_accept
from bench.engine.drafter import Drafter, NoDrafter, StepResult, drafter_seed, start_drafter
from bench.engine.kvcache import attention_windows
from bench.engine.sampling import SamplingConfig, pick_token
from bench.engine.target import features_of, make_target
from bench.engine.timing import Clock, PhaseTimer
from bench.engine.tree import DraftTree, real_tree


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


@dataclass
class TurnOutput:
    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)  # tokens added per decode step (the prefill's is not one)
    verified_tokens: list[int] = field(default_factory=list)  # inputs of each decode step's forward (root + tree)
    drafted_tokens: list[int] = field(default_factory=list)  # draft nodes each decode step verified (0: none drafted)
    tree_steps: list[bool] = field(default_factory=list)  # per decode step: its forward took a tree mask
    phase_seconds: dict[str, float] = field(default_factory=dict)  # PHASES -> seconds

    @property
    def decode_steps(self) -> int:
        """Target forwards after the prefill (Spec-Bench's decoding_steps)."""
        return len(self.accept_lengths)

    @property
    def target_forwards(self) -> int:
        """The prefill and every decode step."""
        return 1 + self.decode_steps


def target_forward(model, feature_layers: tuple[int, ...], **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logits [B, L, vocab] and, when a drafter declares `feature_layers`, its features [B, L, F] (those
    layers' hidden states, concatenated)."""
    out = model(**inputs, output_hidden_states=bool(feature_layers))
    return out.logits, features_of(out, feature_layers)


def open_turn(prompt_ids: list[int], root: int, stop: StopCondition) -> tuple[TurnOutput, list[int], bool]:
    """A row's turn after its prefill picked `root` (its first token, not a decode step): its output, its context
    (prompt + root) and whether it is already over."""
    out = TurnOutput(tokens=[], accept_lengths=[])
    done = stop.extend(out.tokens, [root])
    return out, list(prompt_ids) + [root], done


def record_step(out: TurnOutput, context: list[int], stop: StopCondition, acceptance: Acceptance,
                verified: int, tree: DraftTree | None) -> bool:
    """Book one verified step of a row: its accepted tokens up to the stop, how many, the `verified` inputs of its
    forward and the draft nodes of its `tree` (auxiliary inputs are not drafts); the context grows by every accepted
    token. True when the turn is over."""
    before = len(out.tokens)
    done = stop.extend(out.tokens, acceptance.tokens)
    out.accept_lengths.append(len(out.tokens) - before)
    out.verified_tokens.append(verified)
    out.drafted_tokens.append(0 if tree is None else len(tree))
    context.extend(acceptance.tokens)
    return done


class SpeculativeEngine:
    """Runs draft-then-verify decoding of one prompt with any Hugging Face causal LM."""

    def __init__(self, model, drafter: Drafter | None = None, sampling: SamplingConfig = SamplingConfig(),
                 clock: Clock | None = None, event: Callable | None = None, compile: bool = False):
        self.model = model
        self.drafter = drafter or NoDrafter()
        self.sampling = sampling
        self.clock, self.event = clock, event  # the phase timer's (PhaseTimer); tests inject fakes
        self.device = model.device
        windows = attention_windows(model)  # refuses models whose cache cannot be cut back
        self.feature_layers = tuple(self.drafter.feature_layers)
        self.target = make_target(model, self.feature_layers, windows, compile)  # eager, or compiled (target.py)

    def _accept(self, logits: torch.Tensor, tree: DraftTree | None, generator) -> Acceptance:
        if self.sampling.greedy:
            return greedy_accept(logits, tree)
        return speculative_sampling_accept(logits, tree, self.sampling, generator)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], stop: StopCondition, seed: int | None = None) -> TurnOutput:
        """Decode one prompt until `stop`; returns the new tokens and the tokens accepted per decode step."""
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        timer = PhaseTimer(self.device, self.clock, self.event)
        logits, hidden = self.target.prefill(prompt_ids, stop.max_new_tokens)
        root = pick_token(logits[-1], self.sampling, generator)
        out, context, done = open_turn(prompt_ids, root, stop)
        if self.target.compiled:
            self.drafter.reserve(len(prompt_ids) + stop.max_new_tokens)
        start_drafter(self.drafter, prompt_ids, hidden, drafter_seed(seed))
        timer.lap("prefill")
        while not done:
            tree = real_tree(self.drafter.propose(context, stop.max_new_tokens - len(out.tokens)))
            timer.lap("draft")
            logits, hidden = self.target.verify(root, tree)  # [root, nodes..., aux...] in one forward
            timer.lap("verify")
            acceptance = self._accept(logits, tree, generator)
            self.target.keep(acceptance.rows)
            self.drafter.update(StepResult(tree, logits, acceptance, hidden))
            done = record_step(out, context, stop, acceptance, len(logits), tree)
            root = acceptance.tokens[-1]
            out.tree_steps.append(tree is not None and not tree.is_chain)  # the profile's tree point, not its chain's
            timer.lap("accept")
        out.phase_seconds = timer.seconds
        return out
