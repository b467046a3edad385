"""Acceptance rules on hand-built logits, and a seeded statistical test that SpS samples from the target's distribution
(and that a subtly broken rule is caught by the same test)."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.engine.acceptance import Acceptance, greedy_accept, speculative_sampling_accept
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample
from bench.engine.tree import DraftTree
from methods.sps.draft import slice_target
from methods.sps.drafter import DraftModelDrafter

T1 = SamplingConfig(temperature=1.0)


def as_logits(*rows: list[float]) -> torch.Tensor:
    """[rows, vocab] logits whose temperature-1 softmax is exactly the given probabilities."""
    return torch.tensor(rows, dtype=torch.float64).log()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic (bins expecting < 5 merged) and its critical value at p = 1e-3 (Wilson-Hilferty)."""
    expected = counts.sum() * probs
    big = expected >= 5
    observed, expected = counts[big], expected[big]
    if (~big).any():
        observed = torch.cat([observed, counts[~big].sum()[None]])
        expected = torch.cat([expected, (counts.sum() * probs[~big].sum())[None]])
    dof = len(observed) - 1
    statistic = float(((observed - expected) ** 2 / expected).sum())
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3
    return statistic, critical


def resample_from_p(logits, tree, cfg, generator) -> Acceptance:
    """A classic bug: min(1, p/q) acceptance, but on rejection the token is drawn from p instead of
    norm(max(0, p - q))."""
    rows, tokens = [0], []
    for node, token in enumerate(tree.tokens if tree is not None else []):
        p, q = logits_to_probs(logits[node], cfg), tree.draft_probs[node]
        if torch.rand(1, generator=generator).item() * q[token] >= p[token]:
            tokens.append(sample(p, generator))
            return Acceptance(rows, tokens)
        rows.append(node + 1)
        tokens.append(token)
    tokens.append(sample(logits_to_probs(logits[len(rows) - 1], cfg), generator))
    return Acceptance(rows, tokens)


# --- hand-built logits -------------------------------------------------------------------------------------------


def test_greedy_accept_keeps_the_matching_prefix_and_adds_the_target_token():
    logits = torch.eye(5)[[2, 4, 3, 0]]  # target argmax after root, d1, d2, d3
    assert greedy_accept(logits, DraftTree.chain([2, 4, 1])) == Acceptance([0, 1, 2], [2, 4, 3])
    assert greedy_accept(logits, DraftTree.chain([2, 4, 3])) == Acceptance([0, 1, 2, 3], [2, 4, 3, 0])
    assert greedy_accept(logits, DraftTree.chain([1, 4, 3])) == Acceptance([0], [2])
    assert greedy_accept(logits, None) == Acceptance([0], [2])


def test_draft_equal_to_target_is_always_accepted():
    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]], dtype=torch.float64)
    tree = DraftTree.chain([2, 0], draft_probs=p[:2].float())
    for seed in range(200):
        acceptance = speculative_sampling_accept(p.log(), tree, T1, torch.Generator().manual_seed(seed))
        assert acceptance.rows == [0, 1, 2] and acceptance.tokens[:2] == [2, 0]


def test_rejection_resamples_from_the_residual():
    """p = (.5, .5, 0, 0), q = one-hot(0): token 0 is kept half the time; after a rejection only token 1 has mass."""
    logits = as_logits([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])
    tree = DraftTree.chain([0], draft_probs=torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    kept = 0
    for seed in range(400):
        acceptance = speculative_sampling_accept(logits, tree, T1, torch.Generator().manual_seed(seed))
        if acceptance.num_accepted_drafts:
            kept += 1
            assert acceptance.tokens == [0, 2]  # the bonus comes from the next row
        else:
            assert acceptance.tokens == [1]
    assert 0.4 < kept / 400 < 0.6


def test_deterministic_proposal_outside_the_target_support_is_never_kept():
    logits = torch.tensor([[2.0, 1.0, 0.5, 3.0]])
    top2 = SamplingConfig(temperature=1.0, top_k=2)  # tokens 1 and 2 have p = 0
    for seed in range(100):
        generator = torch.Generator().manual_seed(seed)
        acceptance = speculative_sampling_accept(logits, DraftTree.chain([1]), top2, generator)
        assert acceptance.rows == [0] and acceptance.tokens[0] in (0, 3)


@pytest.mark.parametrize("rule, lossless", [(speculative_sampling_accept, True), (resample_from_p, False)])
def test_one_step_output_follows_p(rule, lossless):
    """Draw x ~ q, apply the rule: the first emitted token must be distributed as p, whatever q is."""
    p = torch.tensor([0.55, 0.25, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = as_logits(p.tolist(), p.tolist())
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(3000):
        tree = DraftTree.chain([sample(q, generator)], draft_probs=q[None])
        counts[rule(logits, tree, T1, generator).tokens[0]] += 1
    statistic, critical = chi_square(counts, p.double())
    assert (statistic < critical) == lossless, (statistic, critical)


# --- SpS end to end on a tiny model ------------------------------------------------------------------------------

VOCAB, PROMPT, POSITION = 8, [3, 1, 5, 2, 6], 2


@pytest.fixture(scope="module")
def small_pair():
    """A tiny float64 target with an 8-token vocabulary, and as draft the same model with its final norm scaled
    by 0.3, i.e. a flatter q that overlaps p: both acceptances and rejections are frequent."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).double().eval()
    draft = slice_target(target, [0, 1])
    with torch.no_grad():
        draft.model.norm.weight.mul_(0.3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    yield target, draft
    torch.set_num_threads(threads)


@torch.no_grad()
def exact_distribution(model, prompt: list[int], position: int, cfg: SamplingConfig) -> torch.Tensor:
    """The target's exact distribution of the token at `position`, by enumerating every earlier continuation."""
    paths = {(): 1.0}
    for _ in range(position):
        seqs = list(paths)
        probs = logits_to_probs(model(torch.tensor([prompt + list(s) for s in seqs])).logits[:, -1], cfg).double()
        paths = {s + (t,): paths[s] * float(row[t])
                 for s, row in zip(seqs, probs) for t in range(len(row)) if row[t] > 0}
    seqs = list(paths)
    probs = logits_to_probs(model(torch.tensor([prompt + list(s) for s in seqs])).logits[:, -1], cfg).double()
    return (torch.tensor([paths[s] for s in seqs], dtype=torch.float64)[:, None] * probs).sum(0)


def position_counts(target, drafter, runs: int) -> tuple[torch.Tensor, list[int]]:
    """Histogram of the token at POSITION over seeded sampled runs with `drafter`, and the accept lengths seen."""
    engine = SpeculativeEngine(target, drafter, T1)
    counts, accept_lengths = torch.zeros(VOCAB, dtype=torch.float64), []
    for seed in range(runs):
        out = engine.generate(PROMPT, StopCondition(POSITION + 3), seed=seed)
        counts[out.tokens[POSITION]] += 1
        accept_lengths += out.accept_lengths
    return counts, accept_lengths


def sps_counts(target, draft, runs: int) -> tuple[torch.Tensor, list[int]]:
    """position_counts of SpS with γ = 3, so the token at POSITION is often a drafted one."""
    drafter = DraftModelDrafter(target, draft_model=draft, num_draft_tokens=3, adaptive=False, sampling=T1, seed=0)
    return position_counts(target, drafter, runs)


def test_sps_samples_the_target_distribution(small_pair, monkeypatch):
    target, draft = small_pair
    exact = exact_distribution(target, PROMPT, POSITION, T1)
    counts, accept_lengths = sps_counts(target, draft, 800)
    statistic, critical = chi_square(counts, exact)
    assert statistic < critical, (statistic, critical)
    assert {1, 4} <= set(accept_lengths)  # both full rejections and fully accepted chains happened

    monkeypatch.setattr("bench.engine.loop.speculative_sampling_accept", resample_from_p)
    counts, _ = sps_counts(target, draft, 800)
    statistic, critical = chi_square(counts, exact)
    assert statistic > critical, "the statistical test failed to catch resampling from p instead of the residual"


# --- trees whose siblings were drawn without replacement (EAGLE under sampling), and Medusa/EAGLE end to end ------


def independent_siblings_rule(logits, tree, cfg, generator) -> Acceptance:
    """A subtle bug: the right rule, but blind to how the siblings were drawn (q not renormalised after a rejection)."""
    tree = DraftTree(tree.tokens, tree.parents, tree.draft_probs, "independent")
    return speculative_sampling_accept(logits, tree, cfg, generator)


@pytest.mark.parametrize("rule, lossless", [(speculative_sampling_accept, True), (independent_siblings_rule, False)])
def test_siblings_drawn_without_replacement_follow_p(rule, lossless):
    """Three children of the root drawn from a peaked q without replacement: the first emitted token is still ~ p."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.6, 0.3, 0.05, 0.05])
    logits = as_logits(p.tolist(), *[p.tolist()] * 3)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(4000):
        drawn = torch.multinomial(q, 3, replacement=False, generator=generator).tolist()
        tree = DraftTree(drawn, [-1, -1, -1], q.expand(3, -1).clone(), "without_replacement")
        counts[rule(logits, tree, T1, generator).tokens[0]] += 1
    statistic, critical = chi_square(counts, p.double())
    assert (statistic < critical) == lossless, (statistic, critical)


@pytest.mark.parametrize("method", ["medusa", "eagle2"])
def test_trained_head_trees_sample_the_target_distribution(small_pair, method):
    """A Medusa tree and an EAGLE-2 tree (both deterministic top-k siblings) on random heads: the token at POSITION
    follows the target's exact distribution."""
    from methods.eagle.dynamic import Eagle2Drafter
    from methods.eagle.head import EagleHead
    from methods.medusa.drafter import MedusaDrafter
    from methods.medusa.heads import MedusaHeads

    target, _ = small_pair
    torch.manual_seed(0)
    if method == "medusa":
        heads = MedusaHeads(32, 2).double()
        for p in heads.parameters():
            torch.nn.init.normal_(p, std=0.3)
        drafter = MedusaDrafter(target, choices=[[0], [1], [0, 0], [0, 1], [1, 0]], heads=heads)
    else:
        drafter = Eagle2Drafter(target, head=EagleHead(target.config).double().eval(), total_token=7, depth=3, top_k=2,
                               sampling=T1, seed=0)
    counts, accept_lengths = position_counts(target, drafter, 800)
    statistic, critical = chi_square(counts, exact_distribution(target, PROMPT, POSITION, T1))
    assert statistic < critical, (statistic, critical)
    assert max(accept_lengths) >= 2  # drafted tokens were accepted, not only bonus tokens


def test_greedy_tokens_is_the_argmax_of_the_logits_own_dtype_ties_to_the_first():
    """greedy_tokens widens bfloat16 to float32 before its argmax (faster on CPU): the same token, ties included."""
    assert greedy_tokens(torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 1.0, 2.0]]).bfloat16()).tolist() == [1, 0]
    tied = torch.randint(-2, 2, (16, 4096), generator=torch.Generator().manual_seed(0)).bfloat16()  # many ties
    assert torch.equal(greedy_tokens(tied), tied.argmax(-1))
    assert torch.equal(greedy_tokens(tied[3]), tied[3].argmax())
