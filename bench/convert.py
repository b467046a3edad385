"""`python -m bench.convert <method> <our checkpoint folder> <out folder> [model=...]`: rewrite a head trained here in
another project's published layout, drafting the same tokens there. A method offers it with a CONVERTER in its
methods/<method>/checkpoints.py (methods/heads/convert.py); the overrides of conf/config.yaml name the target whose
embedding and LM head the head reads (default model=smollm2_135m)."""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from bench.artifacts import PROJECT_ROOT


def converters() -> list[str]:
    """The methods whose checkpoints module declares a CONVERTER (found by reading methods/*/checkpoints.py)."""
    return sorted(path.parent.name for path in (PROJECT_ROOT / "methods").glob("*/checkpoints.py")
                  if "\nCONVERTER = " in path.read_text())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=converters(), help="the method whose checkpoint it is")
    parser.add_argument("checkpoint", type=Path, help="our checkpoint folder (bench.train's artifact)")
    parser.add_argument("out", type=Path, help="the folder to write, in the published layout")
    parser.add_argument("overrides", nargs="*", help="overrides of conf/config.yaml naming the target (model=...)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import torch

    from bench.config import compose_config
    from bench.models import load_model

    args = parse_args(argv)
    converter = importlib.import_module(f"methods.{args.method}.checkpoints").CONVERTER
    target, _ = load_model(compose_config(*args.overrides).model, torch.device("cpu"))
    converter.convert(args.checkpoint, target, args.out)
    print(f"wrote {args.out} ({converter.layout})")


if __name__ == "__main__":
    main()
