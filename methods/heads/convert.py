"""The command shape of the converters that rewrite a trained head of this project in a published layout."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch


def converter_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a converter whose module docstring `doc` gives its summary (first paragraph) and its
    command (second paragraph: `python -m <module> <our checkpoint folder> <out folder> [model=...]`)."""
    summary, command, *rest = doc.split("\n\n")
    command = command.strip()
    parser = argparse.ArgumentParser(prog=" ".join(command.split()[:3]), usage=command, description=summary.rstrip(":"),
                                     epilog="\n\n".join(rest), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="our checkpoint folder (bench.train's artifact)")
    parser.add_argument("out", type=Path, help="the folder to write, in the published layout")
    parser.add_argument("overrides", nargs="*", help="overrides of conf/config.yaml naming the target (model=...)")
    return parser


def convert_checkpoint(argv: list[str] | None, doc: str, load: Callable, ours: type, write: Callable,
                       layout: str) -> None:
    """The command of converter_parser(doc): the target of the overrides' model loaded, our checkpoint loaded by
    `load(folder, target)` -> (module, vocabulary, fingerprint), refused unless it is an `ours`, and written by
    `write(module, vocabulary, out folder)`."""
    from bench.config import compose_config
    from bench.models import load_model

    args = converter_parser(doc).parse_args(argv)
    target, _ = load_model(compose_config(*args.overrides).model, torch.device("cpu"))
    module, vocab, _ = load(str(args.checkpoint), target)
    if not isinstance(module, ours):
        raise SystemExit(f"{args.checkpoint} is already in a published layout")
    write(module, vocab, args.out)
    print(f"wrote {args.out} ({layout})")
