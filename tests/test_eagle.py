"""EAGLE / EAGLE-2 (methods/eagle/): lossless greedy decoding, the head's KV cache, checkpoint formats."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.tree import first_nodes
from bench.errors import MissingArtifactError
from bench.planning.costmodel import Profile
from bench.planning.policy import PlannedDrafter
from methods.eagle.checkpoints import load_eagle
from methods.eagle.dynamic import Eagle2Drafter
from methods.eagle.head import EagleHead
from methods.eagle.static import Eagle1Drafter
from methods.eagle3.drafter import Eagle3Drafter
from methods.eagle3.drafter import random_head as random_eagle3_head
from methods.heads.common import DraftVocabulary, save_heads
from methods.heads.trees import TREES
from tests.conftest import VOCAB
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2

EAGLE_7B_25 = TREES["eagle_7b_25"]


def random_head(model, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(model.config).to(model.dtype).eval()


class Recording:
    """Mixed into a drafter class: records each step's accepted drafts and tree size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.accepted: list[int] = []
        self.sizes: list[int] = []

    def update(self, step):
        super().update(step)
        self.accepted.append(step.acceptance.num_accepted_drafts)
        self.sizes.append(len(step.tree) if step.tree is not None else 0)


@pytest.mark.parametrize("shape", ["eagle1", "eagle2-small", "eagle2-upstream"])
@pytest.mark.parametrize("vocab_slice", [None, 48])
def test_greedy_eagle_equals_vanilla(tiny_model, prompts, shape, vocab_slice, one_thread):
    knobs = {"eagle1": {"choices": EAGLE_7B_25}, "eagle2-small": {"total_token": 8, "depth": 3, "top_k": 2},
             "eagle2-upstream": {"total_token": 60, "depth": 5, "top_k": 10}}[shape]
    vocab = DraftVocabulary(tiny_model.get_output_embeddings(),
                            None if vocab_slice is None else torch.arange(0, VOCAB, VOCAB // vocab_slice))
    recorder = type("Recorder", (Recording, Eagle1Drafter if shape == "eagle1" else Eagle2Drafter), {})
    accepted = []
    for seed, prompt in enumerate(prompts):
        drafter = recorder(tiny_model, head=random_head(tiny_model, seed), vocab=vocab, **knobs)
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
        k = knobs.get("top_k", 0)
        expected_size = 25 if shape == "eagle1" else min(knobs["total_token"] - 1, k + knobs["depth"] * k * k)
        assert max(drafter.sizes) == expected_size
    assert 0 in accepted
    if shape != "eagle2-small":  # wide trees: a random head is sometimes right
        assert max(accepted) >= 1


@torch.no_grad()
def upstream_eagle2_paths(model, head, prompt: list[int], total_token: int, depth: int, top_k: int) -> set[tuple]:
    """The first EAGLE-2 tree as SafeAILab's `topK_genrate` defines it, recomputed without any cache: every node's
    predicted feature comes from an uncached head forward over the context's (token t+1, f_t) pairs and its path.
    Level 1: the root's top_k children; then `depth` times: expand the top_k frontier, all top_k^2 children become
    candidates, the next frontier is their best top_k by cumulative log q; verify the best total_token - 1."""
    ids = torch.tensor([prompt])
    features = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]  # f_0 .. f_{P-1}
    root = int(model(input_ids=ids).logits[0, -1].argmax())
    context = prompt + [root]
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()

    def predicted(path: tuple) -> torch.Tensor:  # the head's feature after the pair ending the path
        feats = [features]
        for d in range(len(path) + 1):
            tokens = context[1:] + list(path[:d])
            out = head(embed(torch.tensor([tokens])), torch.cat(feats)[None])[0, -1]
            feats.append(out[None])
        return feats[-1][0]

    def children(path: tuple, score: float) -> list[tuple[float, tuple]]:
        logq = lm_head(predicted(path)).log_softmax(-1)
        values, tokens = logq.topk(top_k)
        return [(score + float(v), path + (int(t),)) for v, t in zip(values, tokens)]

    frontier = children((), 0.0)
    pool = list(frontier)
    for _ in range(depth):
        candidates = [c for score, path in frontier for c in children(path, score)]
        pool += candidates
        frontier = sorted(candidates, key=lambda c: -c[0])[:top_k]
    return {path for _, path in sorted(pool, key=lambda c: -c[0])[: total_token - 1]}


def tree_paths(tree) -> set[tuple]:
    paths: list[tuple] = []
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)


@pytest.mark.parametrize("total_token, depth, top_k", [(8, 3, 2), (60, 5, 10), (4, 3, 3), (6, 2, 4), (30, 0, 5)])
def test_eagle2_tree_is_upstreams(tiny_model, prompts, total_token, depth, top_k, one_thread):
    """Our first EAGLE-2 proposal (cached head, tree masks, one level per forward) is upstream's tree: the same
    nodes, total_token - 1 of them (the step verifies total_token with the root), best first."""
    head = random_head(tiny_model, 7)
    prompt = prompts[1]
    drafter = Eagle2Drafter(tiny_model, head=head, total_token=total_token, depth=depth, top_k=top_k)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = tiny_model(input_ids=ids, output_hidden_states=True)
    drafter.start(prompt, hidden=out.hidden_states[-1][0])
    tree = drafter.propose(prompt + [int(out.logits[0, -1].argmax())], 100)
    expected = upstream_eagle2_paths(tiny_model, head, prompt, total_token, depth, top_k)
    assert len(tree) == len(expected) == min(total_token - 1, top_k + depth * top_k * top_k)
    assert tree_paths(tree) == expected
    assert tree.draft_probs is None
    assert all(p < i for i, p in enumerate(tree.parents))


class FirstNodesChecked:
    """Mixed into an EAGLE-2 drafter class: every proposal also drafts each size `nodes` with propose_first's
    path (draft_tree with `nodes`; the head's cache cut back to the context between them, as update does) and
    keeps it beside the whole tree's first `nodes` nodes."""

    def propose(self, context, max_tokens):
        root_feature = self._feed_pending(context)
        whole = self.draft_tree(root_feature)
        self.pairs = getattr(self, "pairs", [])
        for nodes in range(len(whole) + 2):
            self.drop_tree_rows()
            self.pairs.append((self.draft_tree(root_feature, nodes), first_nodes(whole, nodes)))
        self.drop_tree_rows()
        return self.draft_tree(root_feature)

    def drop_tree_rows(self):
        self.network.cut_to(self.context_len)


@pytest.mark.parametrize("head_kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("total_token, depth, top_k", [(8, 3, 2), (30, 4, 4), (60, 5, 10)])
def test_first_nodes_are_drafted_with_fewer_levels_alike(tiny_model, prompts, head_kind, total_token, depth, top_k,
                                                        one_thread):
    """propose_first's tree (at most nodes - 1 expansions) is the whole tree's first `nodes` nodes, token for token
    and parent for parent, at every step and size: method.sizing=auto may draft less without drafting otherwise."""
    base, head = ((Eagle2Drafter, random_head(tiny_model, 5)) if head_kind == "eagle" else
                  (Eagle3Drafter, random_eagle3_head(tiny_model, 2, draft_vocab=12, std=0.3)))
    drafter = type("Checked", (FirstNodesChecked, base), {})(tiny_model, head=head, total_token=total_token,
                                                            depth=depth, top_k=top_k)
    assert_lossless(tiny_model, drafter, prompts[2], 30)
    assert len(drafter.pairs) > 3 * total_token // 2
    for first, expected in drafter.pairs:
        got = None if first is None else (list(first.tokens), first.parents)
        want = None if not len(expected) else (list(expected.tokens), expected.parents)
        assert got == want


def test_sizing_auto_drafts_only_the_levels_of_the_nodes_it_keeps(tiny_model, prompts, one_thread):
    """Under method.sizing=auto an EAGLE-2 step asked for k nodes expands min(depth, k - 1) levels (a probe: all of
    them), and decoding stays lossless."""
    asked, levels = [], []

    class Counting(Eagle2Drafter):
        def draft_tree(self, root_feature, nodes=None):
            asked.append(nodes)
            levels.append(0)
            return super().draft_tree(root_feature, nodes)

        def _feed_level(self, *args):
            levels[-1] += 1
            return super()._feed_level(*args)

    drafter = Counting(tiny_model, head=random_head(tiny_model, 5), total_token=30, depth=4, top_k=3)
    verify = Profile({}, [1, 2, 4, 32], [16], [[0.001, 0.001, 0.0012, 0.1]])  # more than 3 nodes never pay
    auto = PlannedDrafter(drafter, verify, tiny_model.device, prior=(1000.0, 1000.0),  # a random head, believed
                          clock=lambda: 0.0)  # drafting free
    for prompt in prompts:
        assert_lossless(tiny_model, auto, prompt, 40)
    assert None in asked and {n for n in asked if n is not None} - {29}
    assert levels == [4 if n is None else min(4, n - 1) for n in asked]


def test_head_cache_equals_a_fresh_prefill_of_the_accepted_context(tiny_model, prompts, one_thread):
    """After every step the head's KV cache holds exactly the pairs (token t+1, target feature f_t) of the accepted
    context, as if they had been fed in one go."""
    prompt = prompts[1]
    head = random_head(tiny_model, 3)
    drafter = Eagle2Drafter(tiny_model, head=head, total_token=10, depth=4, top_k=3)
    out = SpeculativeEngine(tiny_model, drafter).generate(prompt, StopCondition(25))
    held = drafter.network.length
    context = prompt + out.tokens
    assert held == drafter.context_len and len(prompt) - 1 <= held < len(context) - 1
    with torch.inference_mode():
        features = tiny_model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states[-1]
        fresh = DynamicCache(config=head.body.config)
        head(tiny_model.get_input_embeddings()(torch.tensor([context[1 : held + 1]])), features[:, :held], cache=fresh)
    for got, want in zip(drafter.network.cache.layers, fresh.layers):
        torch.testing.assert_close(got.keys, want.keys)
        torch.testing.assert_close(got.values, want.values)


def write_upstream_checkpoint(folder, head: EagleHead, config) -> None:
    """SafeAILab's layout: config.json + pytorch_model.bin with `fc.*`, `layers.0.*` and an embedding table."""
    folder.mkdir()
    state = {"embed_tokens.weight": torch.zeros(config.vocab_size, config.hidden_size)}
    for key, value in head.state_dict().items():
        if key.startswith("fc."):
            state[key] = value.float()
        elif key.startswith("body.layers.0."):
            state[key[len("body."):]] = value.float()
    state["layers.0.input_layernorm.weight"] = torch.ones(config.hidden_size)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "bias": True,
                                                    "hidden_size": config.hidden_size}))


def test_upstream_checkpoint_loads(tiny_model, prompts, tmp_path, one_thread):
    head = random_head(tiny_model, 5)
    write_upstream_checkpoint(tmp_path / "eagle-tiny", head, tiny_model.config)
    loaded, vocab, _ = load_eagle(tmp_path / "eagle-tiny", tiny_model)
    embeds, features = torch.randn(1, 4, 64, dtype=torch.float64), torch.randn(1, 4, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(embeds, features), head(embeds, features), rtol=1e-5, atol=1e-5)
    assert vocab.size == VOCAB
    drafter = Eagle1Drafter(tiny_model, checkpoint=str(tmp_path / "eagle-tiny"), choices=EAGLE_7B_25)
    assert_lossless(tiny_model, drafter, prompts[0], 20)


def test_own_checkpoint_round_trip(tiny_model, tmp_path):
    head = random_head(tiny_model, 6)
    ids = torch.tensor([1, 2, 3, 40, 90])
    save_heads(tmp_path / "ck", {"specbench_method": "eagle"}, {**head.state_dict(), "draft_vocab_ids": ids}, {})
    loaded, vocab, _ = load_eagle(tmp_path / "ck", tiny_model)
    assert vocab.token_ids.tolist() == ids.tolist()
    x = torch.randn(1, 3, 64, dtype=torch.float64)
    rounded = head.half().double()  # what fp16 storage keeps
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, x), rounded(x, x), rtol=1e-3, atol=1e-2)  # rotary buffers differ


def test_missing_checkpoint_names_the_training_command(tiny_model, tmp_path):
    with pytest.raises(MissingArtifactError, match="python -m bench.train method=eagle"):
        load_eagle(tmp_path / "nothing", tiny_model)


@pytest.mark.real_model
@pytest.mark.parametrize("method", ["eagle", "eagle2"])
def test_committed_eagle_head_is_lossless_on_smollm2(method):
    mean_accepted = assert_lossless_on_smollm2(method, category="writing", count=2)
    assert mean_accepted > 1.3
