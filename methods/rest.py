"""REST, retrieval-based speculative decoding (He et al. 2024; FasterDecoding/REST) as a drafter.

Each step: find the longest suffix of the context (max_token_span tokens down to 2) that occurs in the datastore,
take the `draft_length` tokens that followed each occurrence, and verify the trie of the `num_draft` most frequent
continuation prefixes in one forward.
"""
from __future__ import annotations

import numpy as np

from bench.artifacts import artifact_fingerprint
from bench.engine.drafter import Drafter
from bench.engine.tree import DraftTree
from bench.knobs import at_least, check_knobs
from methods.rest_datastore import SEPARATOR, Datastore, build_datastore, datastore_path, is_built


def frequent_prefix_trie(continuations: np.ndarray, num_draft: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the trie of the num_draft prefixes most continuations start with.

    continuations: [m, L] token ids, SEPARATOR-padded. Ties go to the shorter prefix and a prefix is never rarer than
    its extensions, so the chosen prefixes are closed under taking prefixes: a trie. Prefixes are counted depth by
    depth, with np.unique over (id of the prefix so far, next token) keys.
    """
    prefix = np.zeros(len(continuations), dtype=np.int64)  # each continuation's prefix id at the previous depth
    alive = np.ones(len(continuations), dtype=bool)
    tokens, parents, counts, depths = [], [], [], []
    previous_offset = offset = 0  # global node index of the previous / current depth's first prefix
    for depth in range(continuations.shape[1]):
        alive &= continuations[:, depth] != SEPARATOR
        if not alive.any():
            break
        keys = (prefix[alive] << 32) + continuations[alive, depth]
        unique, inverse, count = np.unique(keys, return_inverse=True, return_counts=True)
        tokens.append(unique & 0xFFFFFFFF)
        parents.append((unique >> 32) + previous_offset if depth else np.full(len(unique), -1))
        counts.append(count)
        depths.append(np.full(len(unique), depth))
        prefix[alive] = inverse
        previous_offset, offset = offset, offset + len(unique)
    if not tokens:
        return [], []
    tokens, parents, counts, depths = (np.concatenate(a) for a in (tokens, parents, counts, depths))
    chosen = np.sort(np.lexsort((depths, -counts))[:num_draft])  # by depth, so parents come before children
    position = np.zeros(len(tokens), dtype=np.int64)
    position[chosen] = np.arange(len(chosen))
    chosen_parents = parents[chosen]
    return tokens[chosen].tolist(), np.where(chosen_parents >= 0, position[chosen_parents], -1).tolist()


class RestDrafter(Drafter):
    """Drafts the trie of what followed the context's longest suffix found in the datastore (up to `num_draft` nodes).

    `datastore`: conf/datastore/*.yaml as a dict (`path`; with `auto_build` true, a missing datastore is first built
    from the corpus settings there, with the target's tokenizer; else its absence is refused, naming build_command).
    """

    knob_rules = {"num_draft": at_least(1), "max_token_span": at_least(2), "max_matches": at_least(1),
                  "draft_length": at_least(1)}

    def __init__(self, target=None, tokenizer=None, *, datastore: dict, num_draft: int = 64,
                 max_token_span: int = 16, max_matches: int = 5000, draft_length: int = 10,
                 build_command: str = "python -m bench.datastore model=<model>"):
        check_knobs(type(self), datastore=datastore, num_draft=num_draft, max_token_span=max_token_span,
                    max_matches=max_matches, draft_length=draft_length, build_command=build_command)
        if datastore.get("auto_build") and not is_built(datastore["path"]):
            build_datastore(tokenizer, datastore)
        self.datastore = Datastore.load(datastore["path"], build_command)
        self.artifact = artifact_fingerprint(datastore_path(datastore["path"]))  # identifies it in run keys
        self.num_draft, self.max_token_span = num_draft, max_token_span
        self.max_matches, self.draft_length = max_matches, draft_length

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def most_nodes(self) -> int:
        return self.num_draft

    def propose(self, context: list[int], max_tokens: int) -> DraftTree | None:
        length = min(self.draft_length, max_tokens - 1)
        if length < 1:
            return None
        continuations = self.datastore.retrieve(context, self.max_token_span, 2, self.max_matches, length)
        tokens, parents = frequent_prefix_trie(continuations, self.num_draft)
        return DraftTree(tokens, parents) if tokens else None

    def update(self, step) -> None:
        pass


def tiny_drafter(target, sampling, knobs: dict, tmp_path) -> RestDrafter:
    """For the tests: this drafter at `knobs`' sizes over a datastore of random sequences of a tiny target's
    vocabulary, written under `tmp_path` (tests/test_sampling_methods.py)."""
    from methods.rest_datastore import write_datastore

    corpus = np.random.default_rng(3).integers(0, target.config.vocab_size, (18, 14)).tolist()
    path = write_datastore(tmp_path / "store.idx", corpus, sort_depth=8)
    return RestDrafter(datastore={"path": str(path)}, **{k: v for k, v in knobs.items() if k != "datastore"})
