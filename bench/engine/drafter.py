"""What a drafter is to the engine (the Drafter contract), what it learns after each step, and its seed."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from bench.engine.acceptance import Acceptance
from bench.engine.tree import DraftTree, first_nodes


@dataclass
class StepResult:
    """What a drafter learns after a verification step."""

    tree: DraftTree | None
    logits: torch.Tensor  # [L, vocab] target logits for root, nodes, aux nodes
    acceptance: Acceptance
    hidden: torch.Tensor | None = None  # [L, F] target features of the same rows, for drafters with feature_layers


class Drafter:
    """The contract between a method's proposer and the engine: subclass it and override what the method does.
    `context` is every token so far: prompt, generated tokens and the current root; `max_tokens` is the most tokens
    the step may add (accepted drafts plus the target's own next token): what the turn still takes, or fewer where
    the planner sizes the step (bench/planning/policy.py), so no path of the tree need be longer than max_tokens - 1.

    What a drafter declares (class or instance attributes), and what the engine then gives it:
    - `feature_layers`: indices into transformers' `hidden_states` (-1: the last layer after the final norm, what
      the LM head sees) for a drafter that drafts from the target's own hidden states (Medusa, EAGLE, Hydra). The
      engine hands it the target's features, concatenated over those layers, on the device and without a second
      forward: `start(prompt_ids, hidden=[P, F])` for the prompt and `StepResult.hidden` for each verified step.
      Drafters without `feature_layers` get neither and cost nothing extra.
    - `samples`: the drafter draws random numbers (SpS, EAGLE under sampling). It is built with the run's
      SamplingConfig (`sampling=`) and started with `start(prompt_ids, seed=...)`: `drafter_seed(turn seed)`, a value
      derived from the seed the turn is decoded with and apart from the engine's own acceptance stream, or None
      when the turn has no seed. The drafter seeds its own generator with it at every start(), so a turn's drafts
      depend on that turn's seed alone: the same seed gives the same tokens on a repeat, in any question order, and
      in every row of a batch (each row gets its own row's seed).
    - `artifact`: a fingerprint of the weights or datastore it drafts with (bench.artifacts.artifact_fingerprint),
      part of the run key, so answers made with another artifact are never mixed in; None when it uses none.
    - `learns_across_prompts`: what it learned from earlier turns shapes its drafts (Token Recycling's matrix kept
      for the run). The harness then warms it up as Spec-Bench does (bench/measure/backends/engine.py) and starts
      every repeat of a turn from the same `learned_state()` (bench/measure/decoding.py), so repeats stay repeats.
    - `learns_in_warm_up`: what it learned in that untimed warm-up stays for the timed run (Spec-Bench's runners
      keep Token Recycling's matrix); False puts the drafter back as it was before the warm-up (SuffixDecoding,
      which Spec-Bench never ran: vLLM starts it from an empty global tree).
    - `partial_drafts`: its `propose_first` drafts only the nodes asked for, so a cut tree costs less to draft than
      the whole one (EAGLE-2's levels, SpS's chain); method.sizing=auto then prices drafting per size
      (bench/planning/policy.py).

    The compiled engine (engine.compile) calls `reserve` before each turn (and the harness `precompile` once, before
    timing): a drafter that runs a network then runs it compiled, as the target is
    (bench/engine/drafter_network.py's StaticForward).
    """

    feature_layers: tuple[int, ...] = ()
    samples: bool = False
    artifact: str | None = None
    learns_across_prompts: bool = False
    learns_in_warm_up: bool = True
    partial_drafts: bool = False

    def learned_state(self):
        """A copy of what it learned across prompts (learns_across_prompts), for restore_learned_state."""
        return None

    def restore_learned_state(self, state) -> None:
        """Put back what learned_state() returned."""

    def most_nodes(self) -> int | None:
        """The most nodes (auxiliary inputs included) a tree it proposes can have, for the compiled engine's graphs
        (None: not bounded ahead; every size's graph is made)."""
        return None

    def reserve(self, positions: int) -> None:
        """The compiled engine's next turn reaches at most `positions` positions (prompt and new tokens)."""

    def precompile(self) -> None:
        """The compiled engine, after a reserve and before timing: make the graphs the drafter's steps run."""

    def start(self, prompt_ids: list[int]) -> None:
        """A new turn begins after `prompt_ids` (with `hidden=` and `seed=` as declared above)."""

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        return None

    def propose_first(self, context: list[int], max_tokens: int, nodes: int) -> DraftTree | None:
        """The first `nodes` nodes of propose's tree (what method.sizing=auto verifies of it). A drafter whose first
        nodes need less drafting than its whole tree (deeper levels left out) overrides it to draft only those, and
        declares `partial_drafts`."""
        tree = self.propose(context, max_tokens)
        return None if tree is None else first_nodes(tree, nodes)

    def update(self, step: StepResult) -> None:
        """What the last verification step accepted."""


def drafter_seed(seed: int | None) -> int | None:
    """The seed of a drafter's own random stream in a turn decoded with `seed` (None: none): a hash of it, so that
    the drafter's draws are apart from the engine's acceptance stream (seeded with `seed` itself) and from every
    other turn's."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"drafter stream {seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # < 2**63: any torch or numpy generator takes it


def start_drafter(drafter: Drafter, prompt_ids: list[int], hidden: torch.Tensor | None, seed: int | None) -> None:
    """drafter.start() with what the Drafter contract gives it: features when it declares `feature_layers`, and
    `seed` (already a drafter seed) when it declares that it `samples`."""
    extra = {"hidden": hidden} if drafter.feature_layers else {}
    if drafter.samples:
        extra["seed"] = seed
    drafter.start(list(prompt_ids), **extra)


class NoDrafter(Drafter):
    """Vanilla decoding: proposes nothing, so each step is one target forward for one token."""

    def most_nodes(self) -> int:
        return 0
