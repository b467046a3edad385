"""Token Recycling (methods/recycling.py): the 2.2.2 and SAM-Decoding templates, the adjacency refresh, the
breadth-first fill, the matrix carried across prompts (and shared by batched rows) or reset, seeding from the prefill,
and lossless decoding (greedy, sampled, batched) with drafts that are really accepted."""
from __future__ import annotations

import pytest
import torch

from bench.engine.acceptance import Acceptance
from bench.engine.batched import BatchedEngine
from bench.engine.drafter import StepResult
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.engine.tree import DraftTree
from methods.recycling import TEMPLATES, AdjacencyMatrix, RecyclingDrafter, TreeTemplate
from tests.conftest import generate_tokens
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config
from tests.test_batched import assert_batch_equals_batch_one, batch_prompts  # noqa: F401 (a fixture)
from tests.test_sampling_methods import CONFIGS, joint_test, target  # noqa: F401 (a fixture)


def test_template_2_2_2_has_80_nodes_on_6_levels():
    template = TreeTemplate(TEMPLATES["2.2.2"])
    assert len(template) == 80
    assert [end - begin for begin, end in template.levels] == [8, 21, 25, 15, 8, 3]
    assert max(template.shape.depths) == 6 and max(template.ranks) == 7
    assert all(parent < node for node, parent in enumerate(template.parents))
    assert len({tuple(c) for c in TEMPLATES["2.2.2"]}) == 80  # no node twice


def test_template_samd_is_sam_decodings_60_nodes_on_5_levels():
    """SAM-Decoding's config/token_recycle.json: the root has 7 children; node i's children are its ranks 0..n-1."""
    template = TreeTemplate(TEMPLATES["samd"])
    assert len(template) == 60
    assert [end - begin for begin, end in template.levels] == [7, 20, 21, 8, 4]
    assert max(template.shape.depths) == 5 and max(template.ranks) == 6
    children = [[n for n, parent in enumerate(template.parents) if parent == node] for node in range(-1, 60)]
    assert [len(c) for c in children[:8]] == [7, 6, 5, 3, 2, 2, 1, 1]  # the root, then its children 1..7 upstream
    assert all([template.ranks[n] for n in c] == list(range(len(c))) for c in children)
    assert len({tuple(c) for c in TEMPLATES["samd"]}) == 60


def test_refresh_sets_each_input_tokens_row_to_its_top_k_last_occurrence_winning():
    matrix = AdjacencyMatrix(vocab=10, k=3, device=torch.device("cpu"))
    logits = torch.zeros(3, 10)
    logits[0, [9, 8, 7]] = torch.tensor([3.0, 2.0, 1.0])  # token 5's first occurrence
    logits[1, [1, 2, 3]] = torch.tensor([1.0, 3.0, 2.0])  # token 4
    logits[2, [6, 0, 4]] = torch.tensor([5.0, 4.0, 3.0])  # token 5 again: this row wins
    matrix.refresh(torch.tensor([5, 4, 5]), logits)
    assert matrix.successors[4].tolist() == [2, 3, 1]
    assert matrix.successors[5].tolist() == [6, 0, 4]
    untouched = [t for t in range(10) if t not in (4, 5)]
    assert matrix.successors[untouched].abs().sum() == 0


def test_fill_takes_each_nodes_token_from_its_parents_row():
    template = TreeTemplate(TEMPLATES["2.2.2"])
    generator = torch.Generator().manual_seed(0)
    successors = torch.randint(0, 50, (50, 8), generator=generator)
    tokens = template.fill(successors, 7, template.layout(torch.device("cpu"))).tolist()
    expected = []
    for parent, rank in zip(template.parents, template.ranks):
        parent_token = 7 if parent < 0 else expected[parent]
        expected.append(int(successors[parent_token, rank]))
    assert tokens == expected


def test_update_learns_from_root_and_every_node_then_drafts_from_it(tiny_model):
    drafter = RecyclingDrafter(tiny_model, k=8)
    drafter.start([1, 2, 3])
    first = drafter.propose([1, 2, 3, 4], max_tokens=100)
    assert list(first.tokens) == [0] * 80  # the matrix starts at zeros, as upstream's
    tree = DraftTree([10, 11], [-1, 0])
    logits = torch.zeros(3, 96, dtype=torch.float64)
    logits[0, 30:38] = torch.arange(8, 0, -1, dtype=torch.float64)  # the root (4): successors 30..37
    logits[1, 40:48] = torch.arange(8, 0, -1, dtype=torch.float64)  # node 10: 40..47
    drafter.update(StepResult(tree, logits, Acceptance([0], [30])))
    assert drafter.matrix.successors[4].tolist() == list(range(30, 38))
    assert drafter.matrix.successors[10].tolist() == list(range(40, 48))
    # the next step's root (30, the bonus token) is learned from in the step after it
    assert drafter.root == 30
    second = drafter.propose([1, 2, 3, 4, 30], max_tokens=100)
    assert len(second) == 80 and drafter.propose([1, 2, 3, 4, 30], max_tokens=1) is None


def test_greedy_is_lossless_and_drafts_are_accepted(tiny_model, prompts, one_thread):
    drafter = RecyclingDrafter(tiny_model)
    accepted = []
    for prompt in prompts:
        out = assert_lossless(tiny_model, drafter, prompt, 60)
        accepted += out.accept_lengths
    assert max(accepted) >= 3 and sum(accepted) / len(accepted) > 1.3


def test_greedy_is_lossless_on_windowed_models(windowed_model, prompts, one_thread):
    for prompt in prompts:
        assert_lossless(windowed_model, RecyclingDrafter(windowed_model), prompt, 40)


def test_the_matrix_carries_over_by_default_and_resets_without_carry_over(tiny_model, prompts, one_thread):
    carried, fresh = RecyclingDrafter(tiny_model), RecyclingDrafter(tiny_model, carry_over=False)
    assert (carried.learns_across_prompts, fresh.learns_across_prompts) == (True, False)
    for drafter in (carried, fresh):
        SpeculativeEngine(tiny_model, drafter).generate(prompts[0], StopCondition(20))
    learned = carried.matrix.table.clone()
    assert learned.abs().sum() > 0 and torch.equal(fresh.matrix.table, learned)  # both learned the same turn
    fresh.start(prompts[1])
    carried.start(prompts[1])
    assert fresh.matrix.table.abs().sum() == 0
    assert torch.equal(carried.matrix.table, learned)


def test_learned_state_puts_the_carried_matrix_back(tiny_model, prompts, one_thread):
    """What the harness does before each repeat of a turn: the repeat then drafts (and accepts) as the first did."""
    drafter = RecyclingDrafter(tiny_model)
    engine = SpeculativeEngine(tiny_model, drafter)
    engine.generate(prompts[0], StopCondition(20))
    state = drafter.learned_state()
    before = state.clone()
    first = engine.generate(prompts[1], StopCondition(30))
    assert not torch.equal(drafter.matrix.table, before)
    drafter.restore_learned_state(state)
    assert torch.equal(drafter.matrix.table, before)
    assert engine.generate(prompts[1], StopCondition(30)).accept_lengths == first.accept_lengths
    assert RecyclingDrafter(tiny_model, carry_over=False).learned_state() is None


def test_seed_from_prefill_sets_each_prompt_tokens_row_from_the_prefill_logits(tiny_model, one_thread):
    """The engine hands the prompt's features over; each prompt token's row is the top-k of the target's logits at
    its last occurrence in the prompt, every other row stays zero. Without the knob the prefill teaches nothing."""
    prompt = [5, 9, 5, 17, 9, 3, 5, 40]
    seeded, plain = RecyclingDrafter(tiny_model, seed_from_prefill=True), RecyclingDrafter(tiny_model)
    assert (seeded.feature_layers, plain.feature_layers) == ((-1,), ())
    for drafter in (seeded, plain):
        SpeculativeEngine(tiny_model, drafter).generate(prompt, StopCondition(1))  # the prefill only
    with torch.inference_mode():
        top = tiny_model(torch.tensor([prompt])).logits[0].topk(8, dim=-1).indices
    last = {token: i for i, token in enumerate(prompt)}
    for token in range(seeded.vocab_size):
        expected = top[last[token]].tolist() if token in last else [0] * 8
        assert seeded.matrix.successors[token].tolist() == expected, token
    assert plain.matrix.table.abs().sum() == 0


def test_config_builds_the_upstream_drafter(tiny_model):
    drafter = drafter_from_config("recycling", tiny_model, None)
    assert isinstance(drafter, RecyclingDrafter)
    assert (drafter.k, len(drafter.template), drafter.carry_over, drafter.seed_from_prefill) == (8, 80, True, False)


def test_bad_knobs_are_refused(tiny_model):
    with pytest.raises(ValueError, match="method.drafter.k=4: must exceed every rank"):
        RecyclingDrafter(tiny_model, k=4)
    with pytest.raises(ValueError, match="method.drafter.template=3.3.3: must be one of 2.2.2, samd, or a list"):
        RecyclingDrafter(tiny_model, template="3.3.3")


@pytest.mark.parametrize("knobs", [{}, {"template": "samd", "seed_from_prefill": True}])
def test_batched_rows_equal_batch_one_without_carry_over(tiny_model, batch_prompts, knobs, one_thread):  # noqa: F811
    make = lambda: RecyclingDrafter(tiny_model, carry_over=False, **knobs)  # noqa: E731
    out = assert_batch_equals_batch_one(tiny_model, make, batch_prompts, 30)
    assert any(n > 1 for turn in out.turns for n in turn.accept_lengths)


def test_batched_rows_share_the_carried_matrix(tiny_model, batch_prompts, one_thread):  # noqa: F811
    """With carry_over the rows of a batch refresh the drafter's one matrix (each row's refresh in row order): the
    run is lossless and deterministic, the matrix goes on to the next batch, and the rows drafted from each other's
    lessons (their accepted tokens differ from rows decoded each with a matrix of its own)."""
    stop = StopCondition(30)
    runs = []
    for _ in range(2):
        drafter = RecyclingDrafter(tiny_model)
        out = BatchedEngine(tiny_model, drafter).generate(batch_prompts, stop, [0] * len(batch_prompts))
        runs.append(([t.tokens for t in out.turns], [t.accept_lengths for t in out.turns], drafter.matrix.table))
    assert runs[0][0] == [generate_tokens(tiny_model, p, 30) for p in batch_prompts]
    assert runs[0][1] == runs[1][1] and torch.equal(runs[0][2], runs[1][2]) and runs[0][2].abs().sum() > 0
    apart = BatchedEngine(tiny_model, RecyclingDrafter(tiny_model, carry_over=False)).generate(
        batch_prompts, stop, [0] * len(batch_prompts))
    assert [t.accept_lengths for t in apart.turns] != runs[0][1]


def test_sampling_gives_the_targets_joint_distribution_at_temperature_1(target):  # noqa: F811
    """At temperature 1 (top-k: tests/test_sampling_methods.py, with every method)."""
    cfg = CONFIGS["t1"]
    statistic, critical, accept_lengths = joint_test(target, RecyclingDrafter(target), cfg, 1200)
    assert statistic < critical, (statistic, critical)
    assert max(accept_lengths) >= 2  # drafts were really tried


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    mean_accepted = assert_lossless_on_smollm2("recycling")
    print(f"recycling on SmolLM2: {mean_accepted:.2f} accepted tokens per target forward")
    assert mean_accepted > 1.0
