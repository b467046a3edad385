"""Drafters that run a network (EAGLE heads, draft models) under engine.compile=on: compiled over caches of their own,
they propose the same trees as eager and the output stays vanilla's; the graphs made before timing serve every step."""
from __future__ import annotations

import pytest

from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig
from methods.eagle import dynamic, static
from methods.eagle3 import drafter as eagle3
from methods.pard import drafter as pard
from methods.sps import drafter as sps
from tests.conftest import vanilla_tokens

NEW = 24
DRAFTERS = {  # a tree of several levels and widths (1, 4 and more rows a head forward), a chain of draft forwards
    "eagle": (static.tiny_drafter, {"choices": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]}),
    "eagle2": (dynamic.tiny_drafter, {"total_token": 12, "depth": 3, "top_k": 3}),
    "eagle3": (eagle3.tiny_drafter, {"total_token": 4, "depth": 2, "top_k": 1}),
    "sps": (sps.tiny_drafter, {"num_draft_tokens": 3, "adaptive": True}),
    "pard": (pard.tiny_drafter, {"num_draft_tokens": 3}),  # K - 1 masks and the accepted tokens in one forward
}


def proposals(model, drafter, prompt: list[int], compiled: bool) -> tuple[list[int], list[tuple], int]:
    """(tokens, each step's proposed tree as (tokens, parents), graphs made during the turn) of a greedy turn; the
    compiled engine's graphs, the drafter's and the target's, made before it."""
    from torch._dynamo.utils import counters

    trees = []
    propose = drafter.propose

    def recording(context, max_tokens):
        tree = propose(context, max_tokens)
        trees.append(None if tree is None else (tree.tokens, tree.parents))
        return tree

    drafter.propose = recording
    engine = SpeculativeEngine(model, drafter, compile=compiled)
    if compiled:
        engine.target.reserve(len(prompt) + NEW)
        engine.target.precompile(prompt[:4], 16)
        drafter.reserve(len(prompt) + NEW)
        drafter.precompile()
    made = counters["stats"]["unique_graphs"]
    tokens = engine.generate(prompt, StopCondition(NEW)).tokens
    return tokens, trees, counters["stats"]["unique_graphs"] - made


def tiny(model, method: str):
    make, knobs = DRAFTERS[method]
    return make(model, SamplingConfig(), knobs, None)


@pytest.mark.parametrize("method", DRAFTERS)
def test_compiled_drafters_propose_what_eager_ones_do(tiny_model, prompts, method, one_thread):
    for prompt in prompts[1:]:
        tokens, trees, _ = proposals(tiny_model, tiny(tiny_model, method), prompt, compiled=False)
        assert tokens == vanilla_tokens(tiny_model, prompt, NEW)
        assert any(tree is not None and len(tree[0]) > 1 for tree in trees)
        drafter = tiny(tiny_model, method)
        compiled_tokens, compiled_trees, graphs_made = proposals(tiny_model, drafter, prompt, compiled=True)
        assert drafter.network.compiled
        assert (compiled_tokens, compiled_trees) == (tokens, trees)
        assert graphs_made == 0  # precompile made every graph the turn's steps ran


@pytest.mark.parametrize("head_class", ["eagle", "eagle3"])
def test_a_compiled_head_drafts_with_its_own_weights(tiny_model, prompts, head_class, one_thread):
    """EAGLE-2 heads (and EAGLE-3's, each with an LM head of its own) of one class and other weights, compiled one
    after the other (graphs of 4 and more rows have the weights frozen in): each proposes what its eager twin
    proposes."""
    from methods.eagle.head import EagleHead
    from methods.heads.tiny import random_weights

    def drafter(seed: int):
        if head_class == "eagle3":
            return eagle3.Eagle3Drafter(tiny_model, head=eagle3.random_head(tiny_model, seed, draft_vocab=12, std=0.3),
                                        total_token=12, depth=3, top_k=4)
        head = random_weights(EagleHead(tiny_model.config), seed=seed).to(tiny_model.dtype)
        return dynamic.Eagle2Drafter(tiny_model, head=head, total_token=12, depth=3, top_k=4)

    for seed in (2, 3, 2):
        eager = proposals(tiny_model, drafter(seed), prompts[1], compiled=False)
        compiled = proposals(tiny_model, drafter(seed), prompts[1], compiled=True)
        assert compiled[:2] == eager[:2]


@pytest.mark.parametrize("method", ["eagle", "eagle2", "pld", "suffix", "sps-fixed"])
def test_no_tree_exceeds_the_drafters_most_nodes(tiny_model, prompts, method, one_thread):
    """most_nodes bounds every tree (the compiled engine makes graphs up to it only, before timing)."""
    from methods.pld import PromptLookupDrafter
    from methods.suffix_decoding import SuffixDecodingDrafter

    drafter = {"pld": lambda: PromptLookupDrafter(max_ngram_size=2, num_pred_tokens=3),
               "suffix": lambda: SuffixDecodingDrafter(num_speculative_tokens=5, max_tree_depth=8, max_spec_offset=5),
               "sps-fixed": lambda: sps.tiny_drafter(tiny_model, SamplingConfig(),
                                                     {"num_draft_tokens": 3, "adaptive": False}, None),
               }.get(method, lambda: tiny(tiny_model, method))()
    sizes = []
    for prompt in (prompts[2] * 3, prompts[1]):  # repeats: PLD and suffix match
        _, trees, _ = proposals(tiny_model, drafter, prompt, compiled=False)
        sizes += [len(tree[0]) for tree in trees if tree is not None]
    assert sizes and max(sizes) <= drafter.most_nodes()
    assert max(sizes) >= min(3, drafter.most_nodes())
