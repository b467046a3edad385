"""SAM-Decoding (Hu et al. 2024; hyx1999/SAM-Decoding, Spec-Bench `model/samd/`): drafts copied from the longest
suffix match in suffix automata, with another drafter for the steps where no match is long enough.

Two automata (methods/suffix_automaton.py): a dynamic one over this sequence's prompt and accepted tokens, grown as
they are accepted, and an optional static one over a corpus (the target's own answers, as SAM-Decoding's tools/ build
theirs, or ShareGPT turns; built once and cached). Each keeps a match of
the tokens so far, moved on by each new token in amortised O(1): the decoded length never enters a step's cost.
Each step matches the root on top of both; the longer match (the corpus match counted `len_bias` tokens shorter; the
dynamic one wins ties) proposes the chain of the tokens that followed its earliest occurrence, `n_predicts` inputs
with the root (upstream's 40), when it is at least `len_threshold` tokens long. Otherwise the fallback drafter
proposes its tree: EAGLE-2 (methods/eagle/dynamic.py; the default, as Spec-Bench's eval.sh and SAM-Decoding's
scripts/inference_samd.sh run it: SAMD[EAGLE2]), Token Recycling (methods/recycling.py; SAMD[Token Recycle]) or none.
The fallback sees every step's verification, the chain ones too: Token Recycling learns from their logits, and
EAGLE-2's head consumes the target's features of every accepted token (the prompt's at start, then each step's
accepted rows; SamdDrafter declares the fallback's `feature_layers`, so the engine hands them over), as upstream's
draft model passes each step's accepted tokens and last hidden states to its tree model: the head's cache always
holds the accepted context, whichever drafter proposed.

The Token Recycling fallback is SAM-Decoding's own unless knobs say otherwise (RECYCLING_FALLBACK): its 60-node tree
(`template: samd`), a matrix never reset (`carry_over`: upstream's TokenRecycle.reset does nothing) and refreshed from
every prompt row at the prefill (`seed_from_prefill`). So `learns_across_prompts` holds with that fallback.

As upstream, a dynamic match whose earliest occurrence is too close to the end for a full chain backs off along its
suffix links to a shorter match with a longer continuation (at most `n_predicts` links).
"""
from __future__ import annotations

import copy

from bench.engine.drafter import Drafter, start_drafter
from bench.engine.tree import DraftTree
from bench.errors import MissingArtifactError
from bench.knobs import at_least, check_knobs, one_of
from methods.eagle.checkpoints import TRAIN_COMMAND as EAGLE_TRAIN_COMMAND
from methods.eagle.dynamic import Eagle2Drafter
from methods.recycling import RecyclingDrafter
from methods.rest_datastore import datastore_path
from methods.suffix_automaton import FrozenAutomaton, Match, SuffixAutomaton, build_corpus_automaton

FALLBACKS = ("recycling", "eagle2", "none")
# The `recycling` knobs' defaults: SAM-Decoding's own Token Recycling fallback (its samd/tree_model/token_recycle/)
RECYCLING_FALLBACK = {"template": "samd", "carry_over": True, "seed_from_prefill": True}
EAGLE2_SETTING = "method.drafter.eagle2.checkpoint (conf/method_model/samd/<model>.yaml)"


class SamdDrafter(Drafter):
    """SAM-Decoding's drafter (see module doc).

    `corpus`: settings of the static automaton (conf/method/samd.yaml): `enabled`, `source`, `answers_dir`, `path`,
    `auto_build`, `roles`, `max_conversations`; a missing one is built on first use when auto_build is true, else
    refused naming `build_command`. `recycling`: the knobs of the Token Recycling fallback (over RECYCLING_FALLBACK);
    `eagle2`: Eagle2Drafter's (checkpoint, total_token, depth, top_k; tests pass `head=`) for the EAGLE-2 fallback.
    """

    knob_rules = {"n_predicts": at_least(2), "len_threshold": at_least(1), "fallback": one_of(*FALLBACKS)}
    nested_knobs = {"recycling": RecyclingDrafter}  # the Token Recycling fallback's knobs

    def __init__(self, target=None, tokenizer=None, n_predicts: int = 40, len_threshold: int = 5, len_bias: int = 5,
                 fallback: str = "eagle2", recycling: dict | None = None, eagle2: dict | None = None,
                 corpus: dict | None = None,
                 build_command: str = "python -m bench.datastore method=samd model=<model>"):
        check_knobs(type(self), n_predicts=n_predicts, len_threshold=len_threshold, len_bias=len_bias,
                    fallback=fallback, recycling=recycling, eagle2=eagle2, corpus=corpus, build_command=build_command)
        self.n_predicts, self.len_threshold, self.len_bias = n_predicts, len_threshold, len_bias
        self.fallback = build_fallback(fallback, target, tokenizer, recycling or {}, eagle2 or {})
        self.feature_layers = tuple(getattr(self.fallback, "feature_layers", ()))  # EAGLE-2's: the engine's features
        self.corpus = load_corpus(corpus, tokenizer, build_command) if corpus and corpus.get("enabled") else None
        artifacts = [str(datastore_path(corpus["path"])) if self.corpus is not None else None,
                     getattr(self.fallback, "artifact", None)]  # the corpus and the EAGLE head identify run keys
        self.artifact = "; ".join(a for a in artifacts if a) or None
        self.drafted_from: str | None = None  # last proposal's source: "dynamic", "corpus", "fallback" or None

    @property
    def learns_across_prompts(self) -> bool:
        """True when the fallback carries what it learns from one prompt to the next (SAM-Decoding's recycling)."""
        return getattr(self.fallback, "learns_across_prompts", False)

    def learned_state(self):
        """What the fallback learned across prompts (None when it learns nothing across them)."""
        return self.fallback.learned_state() if self.learns_across_prompts else None

    def restore_learned_state(self, state) -> None:
        if self.learns_across_prompts:
            self.fallback.restore_learned_state(state)

    def most_nodes(self) -> int | None:
        """SAM's chain (n_predicts - 1 tokens) or the fallback's tree, whichever is larger."""
        fallback = 0 if self.fallback is None else self.fallback.most_nodes()
        return None if fallback is None else max(self.n_predicts - 1, fallback)

    def reserve(self, positions: int) -> None:
        if self.fallback is not None:
            self.fallback.reserve(positions)

    def precompile(self) -> None:
        if self.fallback is not None:
            self.fallback.precompile()

    def start(self, prompt_ids: list[int], hidden=None) -> None:
        """A new turn; `hidden` (the prompt's target features) is given when the fallback declares feature_layers."""
        self.automaton = SuffixAutomaton()
        self.match = Match()  # longest suffix of the committed tokens found earlier in them
        self.corpus_match = Match()  # longest suffix of the committed tokens found in the corpus
        if self.fallback is not None:  # a copy per sequence, so forks (batched rows) share only a carried matrix
            self.fallback = copy.copy(self.fallback)
            start_drafter(self.fallback, prompt_ids, hidden, None)  # EAGLE-2's tree draws nothing: no seed

    def commit(self, tokens: list[int]) -> None:
        """Add tokens to the sequence: match first (against the text before each token), then extend."""
        automaton = self.automaton
        for token in tokens:
            match = automaton.advance(self.match, token)
            automaton.extend(token)
            parent = automaton.link[match.state]
            if parent > 0 and match.length <= automaton.length[parent]:  # extend split the match's state
                match = Match(parent, match.length)
            self.match = match
            if self.corpus is not None:
                self.corpus_match = self.corpus.advance(self.corpus_match, token)

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self.commit(context[len(self.automaton.tokens) : -1])  # everything but the root, which is not decided yet
        root, wanted = context[-1], min(self.n_predicts - 1, max_tokens - 1)
        self.drafted_from = None
        draft = self.lookup(root, wanted)
        if draft:
            if isinstance(self.fallback, RecyclingDrafter):  # it learns from the chain's step too, from its root
                self.fallback.follow(root)
            return DraftTree.chain(draft)
        if self.fallback is not None:
            self.drafted_from = "fallback"
            return self.fallback.propose(context, max_tokens)
        return None

    def lookup(self, root: int, wanted: int) -> list[int]:
        """The chain the longer match proposes, or [] when neither reaches len_threshold."""
        if wanted < 1:
            return []
        dynamic = self.automaton.advance(self.match, root)
        corpus = self.corpus.advance(self.corpus_match, root) if self.corpus is not None else Match()
        corpus_length = corpus.length - self.len_bias
        if max(dynamic.length, corpus_length) < self.len_threshold:
            return []
        if dynamic.length >= corpus_length:
            self.drafted_from = "dynamic"
            return self.automaton.continuation(self.back_off(dynamic.state, wanted), wanted)
        self.drafted_from = "corpus"
        return self.corpus.continuation(corpus.state, wanted)

    def back_off(self, state: int, wanted: int) -> int:
        """An ancestor of `state` whose earliest occurrence is followed by `wanted` tokens, if one is within
        n_predicts suffix links (upstream's to_anc)."""
        automaton, end = self.automaton, len(self.automaton.tokens) - 1
        for _ in range(self.n_predicts):
            if automaton.link[state] <= 0 or end - automaton.first_end[state] >= wanted:
                break
            state = automaton.link[state]
        return state

    def update(self, step) -> None:
        if self.fallback is not None:  # chain steps too, as upstream's: Recycling learns, EAGLE-2's head keeps up
            self.fallback.update(step)


def build_fallback(kind: str, target, tokenizer, recycling: dict, eagle2: dict) -> Drafter | None:
    """The drafter of the steps without a long enough match (see module doc)."""
    if kind == "recycling":
        return RecyclingDrafter(target, tokenizer, **{**RECYCLING_FALLBACK, **recycling})
    if kind == "eagle2":
        return eagle2_fallback(target, tokenizer, eagle2)
    return None


def eagle2_fallback(target, tokenizer, knobs: dict) -> Eagle2Drafter:
    """EAGLE-2's drafter over the head `knobs["checkpoint"]` (or a `head` passed in); a missing head is refused in
    one line naming the setting."""
    if not knobs.get("checkpoint") and knobs.get("head") is None:
        raise MissingArtifactError(f"SAM-Decoding's eagle2 fallback needs an EAGLE head and this model has none: "
                                   f"set method.drafter.eagle2.checkpoint (in conf/method_model/samd/<model>.yaml; "
                                   f"train one with: {EAGLE_TRAIN_COMMAND}), or use the training-free "
                                   f"method.drafter.fallback=recycling")
    try:
        return Eagle2Drafter(target, tokenizer, **knobs)
    except MissingArtifactError as err:
        raise type(err)(f"{err} (SAM-Decoding's eagle2 fallback: {EAGLE2_SETTING}, or use "
                        f"method.drafter.fallback=recycling)") from err


def load_corpus(settings: dict, tokenizer, build_command: str) -> FrozenAutomaton:
    path = datastore_path(settings["path"])
    if settings.get("auto_build") and not (path / "meta.json").exists():
        build_corpus_automaton(tokenizer, settings)
    return FrozenAutomaton.load(path, build_command)


def tiny_drafter(target, sampling, knobs: dict, tmp_path) -> SamdDrafter:
    """For the tests: this drafter at `knobs`, its EAGLE-2 fallback over a random head for a tiny target unless
    knobs give one (tests/test_sampling_methods.py)."""
    from methods.eagle.head import EagleHead
    from methods.heads.tiny import random_weights

    if knobs.get("fallback", "eagle2") == "eagle2":
        eagle2 = {k: v for k, v in knobs.get("eagle2", {}).items() if k != "checkpoint"}
        if "head" not in eagle2:
            eagle2["head"] = random_weights(EagleHead(target.config), seed=2).to(target.dtype)
        knobs = {**knobs, "eagle2": eagle2}
    return SamdDrafter(target, **knobs)
