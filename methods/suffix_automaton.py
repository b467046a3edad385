"""Suffix automata for SAM-Decoding (methods/samd.py): a growing one over a sequence's own tokens, and a frozen one
over a corpus (ShareGPT turns, or the target's own answers as SAM-Decoding's tools build theirs), built once and
cached on disk.

A suffix automaton of a text has at most 2T states; state s stands for the substrings that end at the same set of
positions, of lengths (length[link[s]], length[s]]; `first_end[s]` is where the earliest of them ends. Appending a
token costs amortised O(1) (Blumer et al. 1985). A match (state, length) is the longest suffix of some token stream
that occurs in the text; `advance` moves it on by one token in amortised O(1), so a decoder carries it across steps
instead of re-matching its whole suffix.

    python -m bench.datastore method=samd model=<model> [method.drafter.corpus.max_conversations=N]
    python -m bench.datastore method=samd model=<model> method.drafter.corpus.source=answers

builds the corpus automaton that conf/method/samd.yaml's `drafter.corpus` names (e.g.
method.drafter.corpus.max_conversations=300 for a quick build of ShareGPT's).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.errors import MissingArtifactError

SEPARATOR = -1  # between corpus documents: matches and continuations never cross it


@dataclass(frozen=True)
class Match:
    """The longest suffix of a token stream found in the automaton's text: its state and its length (0: none)."""

    state: int = 0
    length: int = 0


class SuffixAutomaton:
    """The suffix automaton of a text that grows by `extend(token)`; `tokens` is the text itself."""

    def __init__(self):
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0  # the state of the whole text

    def __len__(self) -> int:
        """Number of states (at most 2 x len(tokens) + 1)."""
        return len(self.link)

    def _new_state(self, length: int, first_end: int, link: int = -1, edges: dict | None = None) -> int:
        self.next.append({} if edges is None else dict(edges))
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.link) - 1

    def extend(self, token: int) -> None:
        """Append one token (the standard online construction)."""
        position = len(self.tokens)
        self.tokens.append(token)
        current = self._new_state(self.length[self.last] + 1, position)
        state = self.last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = current
            state = self.link[state]
        if state == -1:
            self.link[current] = 0
        else:
            target = self.next[state][token]
            if self.length[state] + 1 == self.length[target]:
                self.link[current] = target
            else:  # split: the shorter strings of `target` also end here now
                clone = self._new_state(self.length[state] + 1, self.first_end[target], self.link[target],
                                        self.next[target])
                while state != -1 and self.next[state].get(token) == target:
                    self.next[state][token] = clone
                    state = self.link[state]
                self.link[target] = self.link[current] = clone
        self.last = current

    def transition(self, state: int, token: int) -> int | None:
        return self.next[state].get(token)

    def advance(self, match: Match, token: int) -> Match:
        """The longest suffix of (matched stream + token) found in the text."""
        return advance(self, match, token)

    def continuation(self, state: int, count: int) -> list[int]:
        """Up to `count` tokens that follow the earliest occurrence of `state`'s strings."""
        start = self.first_end[state] + 1
        return self.tokens[start : start + count]


def advance(automaton, match: Match, token: int) -> Match:
    """Match.advance for any automaton with transition(state, token), link and length."""
    state, length = match.state, match.length
    while state != 0 and automaton.transition(state, token) is None:
        state = int(automaton.link[state])
        length = int(automaton.length[state])
    target = automaton.transition(state, token)
    if target is None:
        return Match()
    return Match(target, length + 1)


class FrozenAutomaton:
    """A finished SuffixAutomaton as flat arrays (memory-mapped from disk): the corpus automaton of SAM-Decoding.

    Transitions are sorted by (state, token): state s's lie in edge_tokens / edge_targets[edge_start[s] :
    edge_start[s + 1]] and are found by binary search. `tokens` is the corpus, SEPARATOR between documents."""

    ARRAYS = ("tokens", "link", "length", "first_end", "edge_start", "edge_tokens", "edge_targets")

    def __init__(self, arrays: dict[str, np.ndarray]):
        for name in self.ARRAYS:
            setattr(self, name, arrays[name])

    @classmethod
    def freeze(cls, automaton: SuffixAutomaton) -> "FrozenAutomaton":
        counts = np.fromiter((len(edges) for edges in automaton.next), dtype=np.int64, count=len(automaton))
        edge_start = np.zeros(len(automaton) + 1, dtype=np.int64)
        np.cumsum(counts, out=edge_start[1:])
        edge_tokens = np.empty(edge_start[-1], dtype=np.int32)
        edge_targets = np.empty(edge_start[-1], dtype=np.int32)
        for state, edges in enumerate(automaton.next):
            begin = edge_start[state]
            for offset, token in enumerate(sorted(edges)):
                edge_tokens[begin + offset] = token
                edge_targets[begin + offset] = edges[token]
        return cls({"tokens": np.asarray(automaton.tokens, dtype=np.int32),
                    "link": np.asarray(automaton.link, dtype=np.int32),
                    "length": np.asarray(automaton.length, dtype=np.int32),
                    "first_end": np.asarray(automaton.first_end, dtype=np.int64),
                    "edge_start": edge_start, "edge_tokens": edge_tokens, "edge_targets": edge_targets})

    def __len__(self) -> int:
        return len(self.link)

    def transition(self, state: int, token: int) -> int | None:
        begin, end = int(self.edge_start[state]), int(self.edge_start[state + 1])
        index = begin + int(np.searchsorted(self.edge_tokens[begin:end], token))
        if index < end and self.edge_tokens[index] == token:
            return int(self.edge_targets[index])
        return None

    def advance(self, match: Match, token: int) -> Match:
        return advance(self, match, token)

    def continuation(self, state: int, count: int) -> list[int]:
        """Up to `count` tokens after the earliest occurrence of `state`'s strings, cut at a document's end."""
        start = int(self.first_end[state]) + 1
        following = self.tokens[start : start + count].tolist()
        return following[: following.index(SEPARATOR)] if SEPARATOR in following else following

    def save(self, path: Path, meta: dict) -> Path:
        """Write the arrays and meta.json into the directory `path`, atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.mkdir(exist_ok=True)
        for name in self.ARRAYS:
            np.save(partial / f"{name}.npy", getattr(self, name))
        (partial / "meta.json").write_text(json.dumps({**meta, "states": len(self),
                                                       "num_tokens": int(len(self.tokens))}, indent=1))
        if path.exists():
            shutil.rmtree(path)
        partial.rename(path)
        return path

    @classmethod
    def load(cls, path: Path, build_command: str) -> "FrozenAutomaton":
        if not (path / "meta.json").exists():
            raise MissingArtifactError(f"SAM-Decoding corpus automaton {path} not found; build it with: "
                                       f"{build_command} (or set method.drafter.corpus.enabled=false)")
        return cls({name: np.load(path / f"{name}.npy", mmap_mode="r") for name in cls.ARRAYS})


def build_frozen(documents, progress: bool = True) -> FrozenAutomaton:
    """The frozen automaton of token documents (iterable of lists), SEPARATOR after each, with a progress bar."""
    from tqdm import tqdm

    automaton = SuffixAutomaton()
    documents = list(documents)
    for document in tqdm(documents, desc="suffix automaton", unit="doc", disable=not progress):
        for token in document:
            automaton.extend(token)
        automaton.extend(SEPARATOR)
    return FrozenAutomaton.freeze(automaton)


ANSWERS_COMMAND = "python -m bench.train method=eagle features.source=self_distill"  # makes the target's answers


def build_corpus_automaton(tokenizer, settings: dict) -> Path:
    """Cache the automaton of the corpus `settings` names (conf/method/samd.yaml's drafter.corpus): `source`
    sharegpt (ShareGPT turns of `roles`, `max_conversations`) or answers (the target's own, from `answers_dir`)."""
    from bench.artifacts import resolve_artifact_path
    from methods.rest_datastore import datastore_path

    path = datastore_path(settings["path"])
    if settings.get("source", "sharegpt") == "answers":
        given = datastore_path(settings["answers_dir"])
        folder = resolve_artifact_path(given) or given  # a relative folder: under the project root when there
        documents = answer_documents(folder, tokenizer.eos_token_id)
        meta = {"corpus": "answers", "answers_dir": str(folder)}
    else:
        documents = sharegpt_documents(tokenizer, settings)
        meta = {"corpus": "sharegpt", "roles": list(settings["roles"]),
                "max_conversations": settings["max_conversations"]}
    print(f"building the SAM-Decoding corpus automaton {path} from {len(documents)} {meta['corpus']} documents")
    frozen = build_frozen(documents)
    frozen.save(path, {"tokenizer": tokenizer.name_or_path, **meta, "documents": len(documents)})
    print(f"wrote {path} ({len(frozen)} states)")
    return path


def sharegpt_documents(tokenizer, settings: dict) -> list[list[int]]:
    """The ShareGPT turns of `settings["roles"]` as written (at most `max_conversations`), tokenized."""
    from tqdm import tqdm

    from bench.corpora import sharegpt_turns

    texts = sharegpt_turns(list(settings["roles"]), settings["max_conversations"])
    documents, batch = [], 256
    for i in tqdm(range(0, len(texts), batch), desc=f"tokenizing {len(texts)} turns", unit="batch"):
        documents += tokenizer(texts[i : i + batch], add_special_tokens=False).input_ids
    return documents


def answer_documents(folder: Path, eos: int | None) -> list[list[int]]:
    """The target's own answers in a self-distillation folder (methods/heads/self_distill.py), as SAM-Decoding's
    tools/gen_sam_alpaca.py makes its documents: prompt + answer, with EOS after it unless it ends with one."""
    import torch

    from methods.heads.self_distill import answer_path

    documents, shard = [], 0
    while answer_path(folder, shard).exists():
        saved = torch.load(answer_path(folder, shard))
        for prompt, answer in zip(saved["prompts"], saved["answers"]):
            document = list(prompt) + list(answer)
            documents.append(document if eos is None or document[-1:] == [eos] else document + [eos])
        shard += 1
    if not documents:
        raise MissingArtifactError(f"no answers of the target in {folder}; make them with: {ANSWERS_COMMAND} (or set "
                                   f"method.drafter.corpus.answers_dir, or method.drafter.corpus.source=sharegpt)")
    return documents


def build(cfg) -> Path:
    """`python -m bench.datastore method=samd`: the corpus automaton of method=samd for the model's tokenizer."""
    from omegaconf import OmegaConf

    from bench.models import load_tokenizer

    return build_corpus_automaton(load_tokenizer(cfg.model), OmegaConf.to_container(cfg.method.drafter.corpus,
                                                                                    resolve=True))
