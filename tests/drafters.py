"""Drafters used only by tests, loadable by `_target_` from a method override."""
from __future__ import annotations

from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree


class RepeatLastDrafter(Drafter):
    """Proposes the last token `width` times: often wrong, sometimes right; output must still equal vanilla's."""

    def __init__(self, target, tokenizer, width: int = 3):
        self.width = width

    def start(self, prompt_ids):
        pass

    def propose(self, context, max_tokens):
        return DraftTree.chain([context[-1]] * min(self.width, max_tokens))

    def update(self, step):
        pass


def recording(drafter_class):
    """A subclass of `drafter_class` that records, in `.accepted`, how many drafted tokens each step accepted."""

    class Recording(drafter_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.accepted: list[int] = []

        def update(self, step):
            super().update(step)
            self.accepted.append(step.acceptance.num_accepted_drafts)

    return Recording
