"""SuffixDecoding (methods/suffix_decoding.py) and its frequency tree (methods/suffix_trie.py): counts against brute
force, upstream's choice of draft and its tie order by hand, the global tree learning across turns, bounded and put
back, and lossless decoding (greedy, sampled, batched, sizing=auto). Draft for draft equality with arctic-inference's
own tree is bench/parity/methods/suffix.py's rows (`python -m bench.parity --methods suffix`: it needs
arctic-inference's compiled tree)."""
from __future__ import annotations

import random

import pytest

from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.errors import ConfigError
from methods.suffix_decoding import SuffixDecodingDrafter
from methods.suffix_trie import SuffixTrie
from tests.conftest import vanilla_tokens
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config
from tests.test_batched import assert_batch_equals_batch_one, batch_prompts  # noqa: F401 (a fixture)
from tests.test_sampling_methods import CONFIGS, joint_test, target  # noqa: F401 (a fixture)


def occurrences(sequences: list[list[int]], string: list[int], depth: int) -> int:
    """How often `string` occurs in the sequences (no longer than depth: the trie's suffixes are cut there)."""
    if len(string) > depth:
        return 0
    n = len(string)
    return sum(seq[i : i + n] == string for seq in sequences for i in range(len(seq) - n + 1))


@pytest.mark.parametrize("seed", range(4))
def test_counts_are_occurrences_after_appends_and_removals(seed):
    rng = random.Random(seed)
    trie, sequences = SuffixTrie(max_depth=4), {}
    for _ in range(12):
        if sequences and rng.random() < 0.3:
            seq_id = rng.choice(list(sequences))
            trie.remove(seq_id)
            del sequences[seq_id]
        else:
            seq_id = rng.randrange(3)
            tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
            trie.extend(seq_id, tokens)
            sequences.setdefault(seq_id, []).extend(tokens)
        for _ in range(20):
            string = [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
            node = trie.match(string)
            assert (node.count if node else 0) == occurrences(list(sequences.values()), string, 4), string
        assert trie.root.count == sum(map(len, sequences.values()))


def test_the_best_scoring_match_drafts_the_most_frequent_continuation():
    trie = SuffixTrie(max_depth=8)
    trie.extend(0, [1, 2, 3, 1, 2, 3, 1, 2, 4])
    # "2" and "1 2" occur 3 times, followed by 3 twice: p(3) = 2/3, then "2 3" always goes on with 1
    # a match of 1 token drafts 1 token (max_spec_factor 1), of 2 tokens 2: the longer one scores 4/3
    draft = trie.speculate([9, 1, 2], max_spec_tokens=24)
    assert (draft.tokens, draft.parents, draft.match_len) == ([3, 1], [-1, 0], 2)
    assert draft.probs == pytest.approx([2 / 3, 2 / 3]) and draft.score == pytest.approx(4 / 3)
    assert trie.speculate([9, 1, 2], 24, max_spec_offset=2.0).tokens == [3, 1, 2, 3]
    assert trie.speculate([9, 1, 2], 24, min_token_prob=0.7).tokens == []  # 2/3 is too unlikely
    assert trie.speculate([7, 1, 2], 1).tokens == [3]  # max_spec_tokens
    # a tree: after 3 1 2 (2/3 each), the match's other child 4 (1/3) ties with 2's two children (1/3 each) and was
    # queued first (arctic-inference 0.3.0 drafts these same four)
    tree = trie.speculate([9, 1, 2], 24, max_spec_offset=2.0, min_token_prob=0.3, tree=True)
    assert (tree.tokens, tree.parents) == ([3, 1, 2, 4], [-1, 0, 1, -1])


def test_equal_counts_are_ordered_as_upstreams_sibling_lists():
    """A new child goes last; a child whose count rises while first of its count goes first in the new count
    (arctic-inference 0.3.0 drafts 2, 3, 2 here too)."""
    trie = SuffixTrie(max_depth=2)
    trie.extend(0, [1, 2, 1, 3])  # after 1: 2 and 3 once each, 2 first (older)
    assert trie.speculate([0, 1], 1, min_token_prob=0).tokens == [2]
    trie.extend(0, [1, 3])  # 3: twice
    assert trie.speculate([0, 1], 1, min_token_prob=0).tokens == [3]
    trie.extend(0, [1, 2])  # 2 rises to 2 as the first (only) child of count 1: first among the count-2 ones
    assert trie.speculate([0, 1], 1, min_token_prob=0).tokens == [2]


def test_a_repeated_prompt_is_drafted_from_the_global_tree(tiny_model, prompts, one_thread):
    """The same prompt again: the first answer, in the global tree, is drafted in growing chains (a match of m
    tokens drafts m), unless carry_over=false forgets it."""
    prompt = prompts[1]
    carried, fresh = SuffixDecodingDrafter(tiny_model), SuffixDecodingDrafter(tiny_model, carry_over=False)
    first = assert_lossless(tiny_model, carried, prompt, 40)
    again = assert_lossless(tiny_model, carried, prompt, 40)
    assert len(again.accept_lengths) < len(first.accept_lengths) and max(again.accept_lengths) >= 8
    assert_lossless(tiny_model, fresh, prompt, 40)
    alone = assert_lossless(tiny_model, fresh, prompt, 40)
    assert alone.accept_lengths == first.accept_lengths
    assert (carried.learns_across_prompts, fresh.learns_across_prompts) == (True, False)


def test_the_global_tree_keeps_the_last_max_cached_requests_responses(tiny_model, prompts, one_thread):
    drafter = SuffixDecodingDrafter(tiny_model, max_cached_requests=2)
    engine = SpeculativeEngine(tiny_model, drafter)
    outputs = [engine.generate(p, StopCondition(12)).tokens for p in prompts[:3]]
    held = drafter.responses.trie.sequences
    assert list(held.values()) == outputs[1:]  # the oldest forgotten, each response under its own id
    assert drafter.responses.trie.root.count == sum(map(len, outputs[1:]))
    assert SuffixDecodingDrafter(tiny_model, max_cached_requests=0).learns_across_prompts is False


def test_learned_state_puts_the_global_tree_back(tiny_model, prompts, one_thread):
    drafter = SuffixDecodingDrafter(tiny_model)
    engine = SpeculativeEngine(tiny_model, drafter)
    engine.generate(prompts[0], StopCondition(20))
    state = drafter.learned_state()
    first = engine.generate(prompts[1], StopCondition(20))
    drafter.restore_learned_state(state)
    repeat = engine.generate(prompts[1], StopCondition(20))
    assert repeat.accept_lengths == first.accept_lengths
    assert list(drafter.responses.trie.sequences) == [0, 1]  # the repeat reused the first's id
    assert SuffixDecodingDrafter(tiny_model, carry_over=False).learned_state() is None


def test_each_step_adds_only_its_new_tokens(tiny_model, prompts, one_thread):
    """Both trees take each token once: the turn's tree holds prompt + output, the global one the output."""
    drafter = SuffixDecodingDrafter(tiny_model)
    out = SpeculativeEngine(tiny_model, drafter).generate(prompts[2], StopCondition(30))
    own = drafter.local.sequences[0]
    assert own == (prompts[2] + out.tokens)[: len(own)] and len(own) >= len(prompts[2]) + len(out.tokens) - 1
    assert drafter.responses.trie.sequences[0] == own[len(prompts[2]) :]


def test_bad_knobs_are_refused_in_one_line(tiny_model):
    with pytest.raises(ConfigError, match=r"method.drafter.min_token_prob=2: must be in \[0, 1\]"):
        SuffixDecodingDrafter(tiny_model, min_token_prob=2)
    with pytest.raises(ConfigError, match="method.drafter.max_cached_requests=-2: must be >= -1"):
        SuffixDecodingDrafter(tiny_model, max_cached_requests=-2)


def test_config_builds_vllms_defaults(tiny_model):
    drafter = drafter_from_config("suffix", tiny_model, None)
    assert (drafter.max_tree_depth, drafter.num_speculative_tokens, drafter.max_cached_requests) == (24, 24, 10000)
    assert drafter.speculation == {"max_spec_factor": 1.0, "max_spec_offset": 0.0, "min_token_prob": 0.1,
                                   "tree": False}


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_is_lossless(tiny_model, prompts, tree, one_thread):
    drafter = SuffixDecodingDrafter(tiny_model, use_tree_spec=tree)
    for prompt in prompts + [prompts[1] * 3]:
        assert_lossless(tiny_model, drafter, prompt, 40)


def test_greedy_is_lossless_with_sizing_auto(tiny_model, prompts, one_thread):
    """sizing=auto's planner cuts drafts and skips steps: the trees still take every token, once."""
    from bench.planning.policy import PlannedDrafter
    from tests.test_batched import linear_profile

    inner = SuffixDecodingDrafter(tiny_model)
    out = assert_lossless(tiny_model, PlannedDrafter(inner, linear_profile(0.0), tiny_model.device), prompts[1] * 3,
                          40)
    assert max(out.accept_lengths) > 1
    assert inner.local.sequences[0] == (prompts[1] * 3 + out.tokens)[: len(inner.local.sequences[0])]


def test_batched_rows_equal_batch_one(tiny_model, batch_prompts, one_thread):  # noqa: F811
    prompts = batch_prompts[:3] + [batch_prompts[1] * 3]
    make = lambda: SuffixDecodingDrafter(tiny_model, carry_over=False)  # noqa: E731 (rows apart: as at batch 1)
    out = assert_batch_equals_batch_one(tiny_model, make, prompts, 30)
    assert any(n > 1 for turn in out.turns for n in turn.accept_lengths)


def test_batched_rows_share_the_carried_global_tree(tiny_model, batch_prompts, one_thread):  # noqa: F811
    from bench.engine.batched import BatchedEngine

    drafter = SuffixDecodingDrafter(tiny_model)
    out = BatchedEngine(tiny_model, drafter).generate(batch_prompts[:3], StopCondition(16), [0] * 3)
    assert [t.tokens for t in out.turns] == [vanilla_tokens(tiny_model, p, 16) for p in batch_prompts[:3]]
    assert sorted(map(len, drafter.responses.trie.sequences.values()))[-1] >= 15  # every row wrote into one tree


@pytest.mark.parametrize("tree", [False, True])
def test_sampling_gives_the_targets_joint_distribution(target, tree):  # noqa: F811
    statistic, critical, accept_lengths = joint_test(target, SuffixDecodingDrafter(target, use_tree_spec=tree),
                                                     CONFIGS["top_k"], 1200)
    assert statistic < critical, (statistic, critical)
    assert max(accept_lengths) >= 2  # drafts were really tried


@pytest.mark.real_model
def test_smollm2_summarization_equals_vanilla():
    mean_accepted = assert_lossless_on_smollm2("suffix")
    print(f"suffix on SmolLM2: {mean_accepted:.2f} accepted tokens per target forward")
    assert mean_accepted > 1.0


def test_the_repeated_prompts_task_asks_each_format_every_fourth_request():
    from bench.config import compose_config
    from tasks import load_questions

    questions = load_questions(compose_config("task=repeated_agentic").task)
    assert len(questions) == 40 and {q["category"] for q in questions} == {"repeated_agentic"}
    formats = [q["turns"][0].split("\n")[0] for q in questions]
    assert len(set(formats)) == 4 and formats[:4] == formats[4:8] == formats[36:]


# --- the suffix parity rows: the loop both sides run, without a model ---------------------------------------

def test_the_simulated_steps_accept_the_longest_drafted_path_the_answer_follows():
    from bench.parity.sides.arctic_driver import accepted_length, simulate

    assert accepted_length([5, 6, 7, 8], [-1, -1, 1, 2], [6, 7, 9]) == 2  # the second branch, two deep
    assert accepted_length([5, 6], [-1, 0], [4]) == 0
    accepted, drafts = [], iter([([11, 12], [-1, 0]), ([13, 99], [-1, 0]), ([], [])])
    out = simulate([1], [10, 11, 12, 13, 14, 15], 6, lambda context, max_tokens: next(drafts), accepted.append)
    # the prefill gives 10; step 1 accepts 11 12, then 13; step 2's 13 99 is wrong (14 is next); step 3 drafts nothing
    assert accepted == [[10], [11, 12, 13], [14], [15]] and out["steps"] == 4


def test_draft_agreement_names_the_first_difference():
    from bench.parity.methods.suffix import draft_agreement

    same = [[[[1], [-1]], [[2, 3], [-1, 0]]]]
    assert draft_agreement(same, same) == "2 of 2 steps"
    assert draft_agreement(same, [[[[1], [-1]], [[2], [-1]]]]) == (
        "1 of 2 steps (first difference: prompt 0, step 1: ours [[2, 3], [-1, 0]], upstream [[2], [-1]])")
