"""Every method is lossless under sampling at its shipped tree shapes: a seeded chi-square test of the joint
distribution of the first three new tokens against the target's exact joint, enumerated on a tiny float64 model with
a 16-token vocabulary (so that Medusa's and EAGLE-2's top-10 trees fit), at temperature 1, top-k and top-p.

A broken-rule twin (on a rejection, sample from p instead of the residual) must be caught by the same test, so the
test has the power to see a biased sampler."""
from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.engine.acceptance import Acceptance
from methods.rest_datastore import write_datastore
from bench.engine.drafter import NoDrafter
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig, logits_to_probs, sample
from methods.eagle import EagleDrafter, EagleHead
from methods.eagle3 import Eagle3Drafter
from methods.hydra import HydraDrafter, HydraHeads
from methods.lookahead import LookaheadDrafter
from methods.medusa import MedusaDrafter
from methods.heads.medusa_heads import MedusaHeads
from methods.pld import PromptLookupDrafter
from methods.recycling import RecyclingDrafter
from methods.rest import RestDrafter
from methods.samd import SamdDrafter
from methods.sps import DraftModelDrafter, slice_target
from tests.test_eagle3 import random_eagle3_head
from tests.test_sampling import chi_square

VOCAB, HIDDEN, NEW = 16, 32, 3
PROMPT = [3, 1, 5, 2, 6, 3, 1, 5]  # repeats, so that PLD and lookahead find matches
CONFIGS = {"t1": SamplingConfig(temperature=1.0), "top_k": SamplingConfig(temperature=1.0, top_k=4),
           "top_p": SamplingConfig(temperature=1.0, top_p=0.8)}
SMOLLM2_EAGLE1 = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]  # conf/model/smollm2_135m.yaml


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).double().eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model
    torch.set_num_threads(threads)


@torch.no_grad()
def exact_joint(model, cfg: SamplingConfig) -> dict[tuple, float]:
    """P(first NEW tokens = s) for every continuation s with nonzero probability."""
    paths = {(): 1.0}
    for _ in range(NEW):
        seqs = list(paths)
        probs = logits_to_probs(model(torch.tensor([PROMPT + list(s) for s in seqs])).logits[:, -1], cfg).double()
        paths = {s + (t,): paths[s] * float(row[t]) for s, row in zip(seqs, probs) for t in range(VOCAB) if row[t] > 0}
    return paths


def random_module(module, seed: int, std: float = 0.3):
    torch.manual_seed(seed)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=std)
    return module.double().eval()


def make_drafter(name: str, model, cfg: SamplingConfig, tmp_path):
    """The method's drafter at a shipped shape, on random weights of the right architecture."""
    method, _, shape = name.partition(":")
    if method == "vanilla":
        return NoDrafter()
    if method == "sps":  # the target with its final norm flattened: q overlaps p, acceptances and rejections both
        draft = slice_target(model, [0, 1])
        with torch.no_grad():
            draft.model.norm.weight.mul_(0.3)
        return DraftModelDrafter(model, draft_model=draft, num_draft_tokens=5, adaptive=True, sampling=cfg, seed=0)
    if method in ("medusa", "hydra"):
        size = None if shape == "full" else int(shape)
        if method == "medusa":
            return MedusaDrafter(model, choices="mc_sim_7b_63", tree_size=size, heads=random_module(MedusaHeads(HIDDEN, 4), 1))
        return HydraDrafter(model, choices="mc_sim_7b_63", tree_size=size, heads=random_module(HydraHeads(HIDDEN, 4), 2))
    if method == "eagle3":  # a 12-token draft vocabulary of the 16 (a non-trivial d2t)
        total_token, depth, top_k = map(int, shape.split("/"))
        head = random_eagle3_head(model, 2, draft_vocab=12, std=0.3)
        return Eagle3Drafter(model, head=head, total_token=total_token, depth=depth, top_k=top_k, sampling=cfg, seed=0)
    head = random_module(EagleHead(model.config), 2, std=0.3)  # drafts tokens the target gives p ~ 0.1-0.3
    if method == "eagle":
        return EagleDrafter(model, head=head, choices=SMOLLM2_EAGLE1 if shape == "smollm2" else "eagle_7b_25",
                            sampling=cfg, seed=0)
    if method == "eagle2":
        total_token, depth, top_k = map(int, shape.split("/"))
        return EagleDrafter(model, head=head, total_token=total_token, depth=depth, top_k=top_k, sampling=cfg, seed=0)
    if method == "pld":
        return PromptLookupDrafter(model, max_ngram_size=3, num_pred_tokens=10)
    if method == "lookahead":
        return LookaheadDrafter(model, window_size=15, ngram_size=5, guess_set_size=15)
    if method == "rest":  # a datastore holding the prompt's continuations: retrieved drafts are frequent
        generator = torch.Generator().manual_seed(3)
        corpus = [PROMPT[i:] + torch.randint(0, VOCAB, (6,), generator=generator).tolist() for i in range(6)] * 3
        path = write_datastore(tmp_path / "store.idx", corpus, sort_depth=8)
        return RestDrafter(datastore={"path": str(path)}, num_draft=16, draft_length=4)
    if method == "recycling":
        return RecyclingDrafter(model)
    if method == "samd":  # a short threshold, so that the prompt's repeats give chains as well as fallback trees
        if shape == "eagle2":  # the EAGLE-2 fallback at SmolLM2's shipped tree (conf/model/smollm2_135m.yaml)
            return SamdDrafter(model, len_threshold=2, fallback="eagle2",
                               eagle2={"head": head, "total_token": 6, "depth": 2, "top_k": 2})
        return SamdDrafter(model, len_threshold=2)
    raise ValueError(name)


def joint_counts(model, drafter, cfg: SamplingConfig, runs: int) -> tuple[dict[tuple, int], list[int]]:
    engine = SpeculativeEngine(model, drafter, cfg)
    counts: dict[tuple, int] = {}
    accept_lengths: list[int] = []
    for seed in range(runs):
        out = engine.generate(PROMPT, StopCondition(NEW), seed=seed)
        key = tuple(out.tokens[:NEW])
        counts[key] = counts.get(key, 0) + 1
        accept_lengths += out.accept_lengths[1:]
    return counts, accept_lengths


def joint_test(model, drafter, cfg: SamplingConfig, runs: int) -> tuple[float, float, list[int]]:
    """(chi-square statistic, critical value at p = 1e-3, accept lengths) of the sampled joint against the exact."""
    exact = exact_joint(model, cfg)
    counts, accept_lengths = joint_counts(model, drafter, cfg, runs)
    assert set(counts) <= set(exact), "a continuation the target gives probability 0 was emitted"
    keys = list(exact)
    statistic, critical = chi_square(torch.tensor([counts.get(k, 0) for k in keys], dtype=torch.float64),
                                     torch.tensor([exact[k] for k in keys], dtype=torch.float64))
    return statistic, critical, accept_lengths


def resample_from_p(logits, tree, cfg, generator) -> Acceptance:
    """The broken twin: each accepted node's first child x (drawn from q, or deterministic) is kept with probability
    min(1, p(x) / q(x)), but after a rejection the bonus token is drawn from p instead of the residual."""
    row, rows, tokens = 0, [0], []
    while True:
        p = logits_to_probs(logits[row], cfg).double()
        children = tree.children[row] if tree is not None and len(tree) else []
        if children:
            node = children[0]
            token = tree.tokens[node]
            q = 1.0 if tree.draft_probs is None else float(tree.draft_probs[node][token])
            if torch.rand(1, generator=generator).item() * q < float(p[token]):
                rows.append(node + 1)
                tokens.append(token)
                row = node + 1
                continue
        tokens.append(sample(p, generator))
        return Acceptance(rows, tokens)


SHIPPED = ["vanilla", "sps", "medusa:8", "medusa:full", "hydra:16", "hydra:full", "eagle:smollm2", "eagle:vicuna",
           "eagle2:8/3/2", "eagle2:60/5/10", "eagle2:4/3/3", "eagle2:6/2/4", "eagle3:8/3/2", "eagle3:60/7/10", "pld",
           "lookahead", "rest", "recycling", "samd", "samd:eagle2"]


SAMPLING_DRAFTERS = ["vanilla", "sps", "medusa:8", "eagle:smollm2", "eagle2:8/3/2", "eagle2:60/5/10"]
CASES = ([(name, "top_k") for name in SHIPPED]
         + [(name, config) for config in ("t1", "top_p") for name in SAMPLING_DRAFTERS])


@pytest.mark.parametrize("name, config", CASES)
def test_method_samples_the_targets_joint_distribution(target, name, config, tmp_path):
    """Every method at every shipped shape under top-k sampling (the most powerful test here: 64 outcomes); the
    drafters whose own probabilities enter the rule, and a deterministic-tree method, also at temperature 1 and
    under top-p."""
    cfg = CONFIGS[config]
    statistic, critical, accept_lengths = joint_test(target, make_drafter(name, target, cfg, tmp_path), cfg, 1200)
    assert statistic < critical, (statistic, critical)
    if name not in ("vanilla", "pld", "lookahead"):  # the drafts were really tried: some steps accepted one
        assert max(accept_lengths) >= 2


@pytest.mark.parametrize("name", ["sps", "medusa:8", "eagle2:8/3/2", "eagle2:60/5/10", "eagle:smollm2"])
def test_the_joint_test_catches_a_broken_rule(target, name, tmp_path, monkeypatch):
    monkeypatch.setattr("bench.engine.loop.speculative_sampling_accept", resample_from_p)
    cfg = CONFIGS["top_k"]
    statistic, critical, _ = joint_test(target, make_drafter(name, target, cfg, tmp_path), cfg, 1200)
    assert statistic > critical, "the joint test failed to catch resampling from p instead of the residual"


def test_exact_joint_is_a_distribution(target):
    for cfg in CONFIGS.values():
        assert sum(exact_joint(target, cfg).values()) == pytest.approx(1.0, abs=1e-6)  # float32 probabilities
    assert len(exact_joint(target, CONFIGS["top_k"])) <= 4 ** NEW
    assert all(len(s) == NEW for s in itertools.islice(exact_joint(target, CONFIGS["t1"]), 5))
