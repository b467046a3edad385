"""Prompt lookup decoding (Saxena 2023): draft by copying what followed an earlier occurrence of the last n-gram.

Same candidates as transformers' `PromptLookupCandidateGenerator` (n from `max_ngram_size` down to 1, the first
n that has an earlier occurrence wins, up to `num_pred_tokens` tokens, cut before an EOS token), except that
`match="latest"` takes the most recent occurrence where transformers takes the earliest (`match="first"`).
Lookups go through an n-gram index grown by the new tokens of each step, so a step costs O(new tokens), not
O(context).
"""
from __future__ import annotations

from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs, one_of


class PromptLookupDrafter(Drafter):
    knob_rules = {"max_ngram_size": at_least(1), "num_pred_tokens": at_least(1), "match": one_of("latest", "first")}

    def __init__(self, target=None, tokenizer=None, max_ngram_size: int = 3, num_pred_tokens: int = 10,
                 match: str = "latest"):
        check_knobs(type(self), max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens, match=match)
        self.max_ngram_size, self.num_pred_tokens, self.keep_latest = max_ngram_size, num_pred_tokens, match == "latest"
        eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos]) - {None}
        self.start([])

    def start(self, prompt_ids: list[int]) -> None:
        # continuation_start[n - 1][ngram] = index just after an occurrence of that n-gram
        self.continuation_start: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_ngram_size)]
        self.indexed_until = 0  # every n-gram followed by a token at index <= indexed_until is indexed

    def _index_up_to(self, context: list[int]) -> None:
        """Index every n-gram that has at least one token after it (so never the context's own last n-gram)."""
        for end in range(self.indexed_until + 1, len(context)):  # the n-gram is context[end - n : end]
            for n in range(1, min(self.max_ngram_size, end) + 1):
                table = self.continuation_start[n - 1]
                ngram = tuple(context[end - n : end])
                if self.keep_latest or ngram not in table:
                    table[ngram] = end
        self.indexed_until = max(self.indexed_until, len(context) - 1)

    def most_nodes(self) -> int:
        return self.num_pred_tokens

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        self._index_up_to(context)
        for n in range(min(self.max_ngram_size, len(context) - 1), 0, -1):
            start = self.continuation_start[n - 1].get(tuple(context[-n:]))
            if start is not None:
                draft = context[start : start + min(self.num_pred_tokens, max_tokens - 1)]
                for i, token in enumerate(draft):
                    if token in self.eos_token_ids:
                        draft = draft[:i]
                        break
                return DraftTree.chain(draft) if draft else None
        return None

    def update(self, step) -> None:
        pass
