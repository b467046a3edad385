"""SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; snowflakedb/ArcticInference, as vLLM's `suffix` method runs
it: vllm/v1/spec_decode/suffix_decoding.py): training-free drafts from suffix trees of what the run has seen.

Two frequency trees (methods/suffix_trie.py): one per turn over its prompt and output so far, and a global one over
the outputs of earlier turns (their responses only, each under its own id, the current turn's included as it grows),
kept for the run like Token Recycling's matrix. Each step's accepted and bonus tokens join both trees (the prefill's
token at the first draft), as vLLM adds each step's sampled tokens; a draft is asked of both trees after the
context's last `max_tree_depth` tokens; the higher score wins (this turn's tree on a tie). The draft is a chain (vLLM's
`suffix`) or, with `use_tree_spec`, a tree; its size follows the match length (`max_spec_factor`,
`max_spec_offset`), at most `num_speculative_tokens` and what the step may still add.

The global tree keeps the responses of the last `max_cached_requests` turns, forgetting the oldest first (upstream's
FIFO eviction; 0: no global tree), so neither its size nor a step's cost grows with the run. `carry_over: false`
starts every turn with an empty global tree (then only this turn's own output is in it: upstream with
max_cached_requests=1), so that a turn's drafts depend on its own tokens only (order-independent rows).
A carried tree is made with the drafter and shared by its copies: the rows of a batch add their outputs to one tree,
as vLLM's requests do. `learned_state` notes which responses the global tree holds; `restore_learned_state` rebuilds
it from them when they changed (the same counts; equal counts in the order of appending the kept responses one
after another, which is the original order at batch size 1 unless responses were evicted meanwhile).
"""
from __future__ import annotations

from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.suffix_trie import Draft, SuffixTrie

LOCAL = 0  # the turn's own tree holds one sequence


def probability(value, knobs: dict) -> str | None:
    return None if 0 <= value <= 1 else "must be in [0, 1]"


def non_negative(value, knobs: dict) -> str | None:
    return None if value >= 0 else "must be >= 0"


class ResponseCache:
    """The global tree: the responses of the last `max_cached` turns (-1: all), each under its own sequence id."""

    def __init__(self, max_depth: int, max_cached: int):
        self.max_depth, self.max_cached = max_depth, max_cached
        self.trie = SuffixTrie(max_depth)
        self.next_id = 0

    @property
    def enabled(self) -> bool:
        return self.max_cached != 0

    def open(self) -> int | None:
        """A sequence id for a new turn's response (None when disabled); the oldest ones are forgotten past
        max_cached."""
        if not self.enabled:
            return None
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.trie.extend(seq_id, [])
        while 0 < self.max_cached < len(self.trie.sequences):
            self.trie.remove(next(iter(self.trie.sequences)))  # dicts keep insertion order: the oldest first
        return seq_id

    def snapshot(self) -> tuple:
        """Which responses it holds, to what length (the token lists are only ever appended to)."""
        return self.next_id, tuple((seq_id, tokens, len(tokens)) for seq_id, tokens in self.trie.sequences.items())

    def restore(self, snapshot: tuple) -> None:
        if snapshot == self.snapshot():
            return
        self.next_id, held = snapshot
        self.trie = SuffixTrie(self.max_depth)
        for seq_id, tokens, length in held:
            self.trie.extend(seq_id, tokens[:length])


class SuffixDecodingDrafter(Drafter):
    """SuffixDecoding's drafter (see module doc)."""

    knob_rules = {"max_tree_depth": at_least(1), "num_speculative_tokens": at_least(1),
                  "max_spec_factor": non_negative, "max_spec_offset": non_negative, "min_token_prob": probability,
                  "max_cached_requests": at_least(-1)}

    def __init__(self, target=None, tokenizer=None, max_tree_depth: int = 24, num_speculative_tokens: int = 24,
                 max_spec_factor: float = 1.0, max_spec_offset: float = 0.0, min_token_prob: float = 0.1,
                 use_tree_spec: bool = False, max_cached_requests: int = 10000, carry_over: bool = True):
        check_knobs(type(self), max_tree_depth=max_tree_depth, num_speculative_tokens=num_speculative_tokens,
                    max_spec_factor=max_spec_factor, max_spec_offset=max_spec_offset, min_token_prob=min_token_prob,
                    use_tree_spec=use_tree_spec, max_cached_requests=max_cached_requests, carry_over=carry_over)
        self.max_tree_depth, self.num_speculative_tokens = max_tree_depth, num_speculative_tokens
        self.speculation = {"max_spec_factor": max_spec_factor, "max_spec_offset": max_spec_offset,
                            "min_token_prob": min_token_prob, "tree": use_tree_spec}
        self.max_cached_requests, self.carry_over = max_cached_requests, carry_over
        self.responses = ResponseCache(max_tree_depth, max_cached_requests)  # carried: shared by every copy
        self.last_draft: Draft | None = None

    # Spec-Bench never ran it; vLLM starts its global tree empty, so the warm-up's lesson (the first question's
    # answer, decoded 3 times) is forgotten before the timed run (bench.engine.drafter.Drafter).
    learns_in_warm_up = False

    @property
    def learns_across_prompts(self) -> bool:
        """True when earlier turns' outputs shape this turn's drafts (a carried global tree)."""
        return self.carry_over and self.responses.enabled

    def learned_state(self):
        return self.responses.snapshot() if self.learns_across_prompts else None

    def restore_learned_state(self, state) -> None:
        if state is not None:
            self.responses.restore(state)

    def start(self, prompt_ids: list[int]) -> None:
        if not self.carry_over:
            self.responses = ResponseCache(self.max_tree_depth, self.max_cached_requests)
        self.local = SuffixTrie(self.max_tree_depth)
        self.local.extend(LOCAL, prompt_ids)
        self.response_id = self.responses.open()
        self.seen = len(prompt_ids)

    def most_nodes(self) -> int:
        return self.num_speculative_tokens

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self.add(context[self.seen :])  # the prefill's token (and any step this drafter did not see)
        self.last_draft = draft = self.speculate(context[-self.max_tree_depth :],
                                                 min(self.num_speculative_tokens, max_tokens - 1))
        return DraftTree(draft.tokens, draft.parents) if draft.tokens else None

    def update(self, step) -> None:
        """The step's accepted tokens and bonus token join both trees, as vLLM adds each step's sampled tokens
        (the turn's last step's too)."""
        self.add(step.acceptance.tokens)

    def add(self, tokens: list[int]) -> None:
        self.local.extend(LOCAL, tokens)
        if self.response_id is not None:
            self.responses.trie.extend(self.response_id, tokens)
        self.seen += len(tokens)

    def speculate(self, pattern: list[int], max_spec_tokens: int) -> Draft:
        """The better draft of this turn's tree and the global one (this turn's on a tie)."""
        own = self.local.speculate(pattern, max_spec_tokens, **self.speculation)
        if self.response_id is None:
            return own
        other = self.responses.trie.speculate(pattern, max_spec_tokens, **self.speculation)
        return own if own.score >= other.score else other
