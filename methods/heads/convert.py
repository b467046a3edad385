"""How a method rewrites a trained head of this project in a published layout (`python -m bench.convert <method>`):
its checkpoints module declares a CONVERTER."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Converter:
    """`load(folder, target)` -> (module, vocabulary, fingerprint) reads one of our checkpoints, which must hold an
    `ours`; `write(module, vocabulary, out folder)` writes it in the published layout named `layout`."""

    layout: str
    load: Callable
    ours: type
    write: Callable

    def convert(self, checkpoint: Path, target, out: Path) -> None:
        module, vocab, _ = self.load(str(checkpoint), target)
        if not isinstance(module, self.ours):
            raise SystemExit(f"{checkpoint} is already in a published layout")
        self.write(module, vocab, out)
