"""REST: suffix-array datastore, retrieval of the longest matching suffix, frequency trie, output equals vanilla."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.corpora import read_json_array
from bench.errors import MissingArtifactError
from bench.measure.run import run
from methods.rest import RestDrafter, frequent_prefix_trie
from methods.rest_datastore import Datastore, sort_suffixes, write_datastore
from tests.conftest import VOCAB, vanilla_tokens
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, compose_method, drafter_from_config

TURNS = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9, 9, 8], [2, 3, 4, 5, 0, 1], [5, 6, 7]]


@pytest.fixture
def toy_store(tmp_path):
    return write_datastore(tmp_path / "toy.idx", TURNS, sort_depth=4)


@pytest.mark.parametrize("depth", [1, 2, 4, 16])
def test_suffixes_are_sorted_on_their_first_depth_tokens(depth):
    tokens = np.random.default_rng(depth).integers(-1, 4, 500)
    order = sort_suffixes(tokens, depth)
    keys = [(tokens[p : p + depth].tolist(), p) for p in order]  # ties in position order
    assert sorted(order.tolist()) == list(range(500)) and keys == sorted(keys)


def test_occurrences_and_longest_suffix_retrieval(toy_store):
    store = Datastore.load(toy_store)
    assert sorted(store.occurrences([2, 3]).tolist()) == [1, 9, 15]  # positions in the joined token array
    assert store.occurrences([7, 1]).tolist() == []  # never across a turn boundary
    # [1, 2, 3] is the longest suffix that occurs (twice): [0, 1, 2, 3] does not
    assert store.retrieve([0, 1, 2, 3], 16, 2, 5000, 4).tolist() == [[4, 5, 6, 7], [9, 9, 8, -1]]
    # [9, 2, 3] does not occur, so [2, 3] is used: three occurrences, in suffix order
    assert store.retrieve([9, 2, 3], 16, 2, 5000, 4).tolist() == [[4, 5, 6, 7], [4, 5, 0, 1], [9, 9, 8, -1]]
    assert store.retrieve([9, 2, 3], 16, 2, 2, 4).tolist() == [[4, 5, 6, 7], [9, 9, 8, -1]]  # evenly spaced sample
    assert store.retrieve([5, 6, 7], 16, 2, 5000, 4).tolist() == []  # every occurrence ends its turn
    assert store.retrieve([7], 16, 2, 5000, 4).tolist() == []  # shorter than the shortest span


def test_frequent_prefix_trie():
    continuations = np.array([[4, 5, 0, 1], [4, 5, 6, 7], [9, 9, 8, -1], [4, 5, 0, -1], [4, 7, -1, -1]])
    tokens, parents = frequent_prefix_trie(continuations, 64)
    paths = []
    for node in range(len(tokens)):
        path = [tokens[node]]
        while parents[node] >= 0:
            node = parents[node]
            path.insert(0, tokens[node])
        paths.append(path)
    assert paths == [[4], [9], [4, 5], [4, 7], [9, 9], [4, 5, 0], [4, 5, 6], [9, 9, 8], [4, 5, 0, 1], [4, 5, 6, 7]]
    # the 4 most frequent prefixes: [4] x4, [4 5] x3, [4 5 0] x2, then among the x1 ones the shortest, [9]
    assert frequent_prefix_trie(continuations, 4) == ([4, 9, 5, 0], [-1, -1, 0, 2])


def test_drafter_proposes_the_trie_of_retrieved_continuations(toy_store):
    drafter = RestDrafter(datastore={"path": str(toy_store)}, num_draft=64, draft_length=3)
    tree = drafter.propose([8, 2, 3], max_tokens=100)
    assert (tree.tokens, tree.parents) == ([4, 9, 5, 9, 0, 6, 8], [-1, -1, 0, 1, 2, 2, 3])
    assert drafter.propose([8, 2, 3], max_tokens=2).tokens == [4, 9]  # at most max_tokens - 1 deep
    assert drafter.propose([6, 6, 6], max_tokens=100) is None


def test_missing_datastore_names_path_and_build_command(tmp_path):
    with pytest.raises(MissingArtifactError) as error:
        RestDrafter(datastore={"path": str(tmp_path / "none.idx"), "auto_build": False},
                    build_command="python -m bench.datastore model=m")
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "none.idx") in message
    assert message.endswith("python -m bench.datastore model=m")


def test_config_points_at_the_datastore_and_its_build_command(tiny_model, tmp_path):
    cfg = compose_method("rest", f"datastore.path={tmp_path}/x.idx")
    assert cfg.method.drafter.datastore.path == f"{tmp_path}/x.idx" and cfg.method.drafter.datastore.auto_build
    assert cfg.method.drafter.build_command == (
        f"python -m bench.datastore model={cfg.model.name} datastore.path={tmp_path}/x.idx")
    assert (cfg.method.drafter.num_draft, cfg.method.drafter.max_token_span) == (64, 16)
    with pytest.raises(MissingArtifactError):
        drafter_from_config("rest", tiny_model, None, f"datastore.path={tmp_path}/x.idx", "datastore.auto_build=false")


def test_truncated_json_array_yields_the_complete_items():
    assert list(read_json_array('[{"a": 1}, {"b": [2, 3]},\n {"c": "cut off')) == [{"a": 1}, {"b": [2, 3]}]
    assert list(read_json_array("[1, 2, 3]", limit=2)) == [1, 2]


def test_greedy_output_equals_vanilla(tiny_model, prompts, tmp_path, one_thread):
    """A datastore holding the model's own continuations (and noise): drafts get accepted, output unchanged."""
    generator = torch.Generator().manual_seed(5)
    noise = [torch.randint(0, VOCAB, (30,), generator=generator).tolist() for _ in range(20)]
    own = [prompt[-4:] + vanilla_tokens(tiny_model, prompt, 40) for prompt in prompts[:2]]
    path = write_datastore(tmp_path / "own.idx", noise + own, sort_depth=16)
    for prompt in prompts:
        out = assert_lossless(tiny_model, RestDrafter(datastore={"path": str(path)}), prompt, 40)
        if prompt in prompts[:2]:
            assert out.decode_steps < 10  # 40 tokens, mostly retrieved 10 at a time


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla(tmp_path):
    from methods.rest_datastore import build

    cfg = compose_method("rest", "datastore.max_conversations=300", f"datastore.path={tmp_path}/small.idx")
    build(cfg)
    assert assert_lossless_on_smollm2("rest", f"datastore.path={tmp_path}/small.idx") > 1.0


def test_resuming_after_the_datastore_was_rebuilt_is_refused(compose, tmp_path):
    store = write_datastore(tmp_path / "store.idx", TURNS, sort_depth=4)
    args = ("method=rest", f"datastore.path={store}", "task=qa", "task.limit=1", "baseline=false")
    run(compose(*args))
    run(compose(*args, "task.limit=2"))  # same datastore: the run resumes
    write_datastore(store, TURNS[:2], sort_depth=4)
    with pytest.raises(ValueError, match="holds an answer made with other weights, datastore or device than this "
                                         r"run's, under the same settings \(run_key [0-9a-f]+ there, [0-9a-f]+ here\): "
                                         r"pass another out_dir=...$"):
        run(compose(*args, "task.limit=3"))


def test_a_missing_datastore_is_built_on_first_use(compose, tmp_path, capsys):
    """`python -m bench method=rest` on a fresh machine: the datastore is built (here from 20 conversations, with the
    target's tokenizer), the run says where it went, and the next run reuses it."""
    store = tmp_path / "auto.idx"
    args = ("method=rest", f"datastore.path={store}", "datastore.max_conversations=20", "task=qa", "task.limit=1")
    run(compose(*args))
    captured = capsys.readouterr()
    assert f"building REST datastore {store} from " in captured.out and f"wrote {store}" in captured.out
    assert "tokenizing" in captured.err  # the progress bar
    assert Datastore.load(store).tokens.size > 1000
    run(compose(*args, "task.limit=2"))
    assert "building REST datastore" not in capsys.readouterr().out
