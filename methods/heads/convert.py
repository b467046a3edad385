"""The command shape of the converters that rewrite a trained head of this project in a published layout."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch


def convert_checkpoint(argv: list[str] | None, usage: str, load: Callable, ours: type, write: Callable,
                       layout: str) -> None:
    """`<our checkpoint folder> <out folder> [overrides]`: the target of the overrides' model loaded, our checkpoint
    loaded by `load(folder, target)` -> (module, vocabulary, fingerprint), refused unless it is an `ours`, and
    written by `write(module, vocabulary, out folder)`."""
    from bench.config import compose_config
    from bench.models import load_model

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit(usage)
    target, _ = load_model(compose_config(*args[2:]).model, torch.device("cpu"))
    module, vocab, _ = load(args[0], target)
    if not isinstance(module, ours):
        raise SystemExit(f"{args[0]} is already in a published layout")
    write(module, vocab, Path(args[1]))
    print(f"wrote {args[1]} ({layout})")
