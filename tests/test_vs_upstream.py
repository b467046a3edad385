"""The pure parts of benchmarks/vs_upstream.py and its drivers: Spec-Bench's prompt order, forwards counted from
accept lengths, SAM-Decoding's tree file as choices, the missing checkout's message."""
import json
from types import SimpleNamespace

import pytest

from benchmarks.upstream_driver import forwards_until_done, running_sums, spec_bench_order
from benchmarks.vs_upstream import (
    decode_step_lengths,
    knob_text,
    recycle_tree_choices,
    samd_recycling_knobs,
    spec_bench_checkout,
)
from methods.recycling import TEMPLATES

TREE_ADJ = {"0": [1, 2, 3], "1": [4, 5], "2": [6], "3": [], "4": [7], "5": [], "6": [], "7": []}
TREE_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_spec_bench_order_warms_up_on_both_turns_of_the_first_question_uncounted():
    prompts = [[1], [2], [3], [4]]
    assert spec_bench_order(prompts, 2) == [(False, [1]), (False, [2]), (False, [1]), (False, [2]),
                                            (True, [1]), (True, [2]), (True, [3]), (True, [4])]
    assert spec_bench_order(prompts, 0) == [(True, p) for p in prompts]


def test_forwards_until_done_counts_the_prefill_and_the_steps_until_every_token_was_known():
    # Token Recycling: step s makes accept_lengths[s] tokens known
    assert running_sums([3, 3, 2, 2, 6, 2]) == [3, 6, 8, 10, 16, 18]
    assert forwards_until_done(running_sums([3, 3, 2, 2, 6, 2]), list(range(16))) == 6
    # SAM-Decoding: the prefill already picked the first root
    assert running_sums([2, 3, 2, 2, 5, 3], start=1) == [3, 6, 8, 10, 15, 18]
    assert forwards_until_done(running_sums([2, 3, 2, 2, 5, 3], start=1), list(range(16))) == 7
    # cut at EOS: done as soon as the EOS was known
    assert forwards_until_done([2, 6, 9], [5, 6, 7, 8, 2]) == 3


def test_recycle_tree_choices_reads_children_in_rank_order_level_by_level():
    assert recycle_tree_choices(TREE_ADJ) == TREE_CHOICES


def test_knob_text_writes_overrides_with_trees_by_size():
    assert knob_text({"k": 8, "template": [[0], [1]], "carry_over": True}, "recycling.") == (
        "recycling.k=8 recycling.template=<2 choices> recycling.carry_over=true")


def test_samd_recycling_knobs_use_spec_bench_tree_carried_over(tmp_path):
    (tmp_path / "model" / "samd" / "config").mkdir(parents=True)
    (tmp_path / "model" / "samd" / "config" / "token_recycle.json").write_text(json.dumps({"tree_adj": TREE_ADJ}))
    knobs, _ = samd_recycling_knobs(tmp_path)
    assert knobs["template"] == ("samd" if "samd" in TEMPLATES else TREE_CHOICES)
    assert (knobs["k"], knobs["carry_over"]) == (8, True)


def test_a_missing_spec_bench_checkout_says_how_to_get_it(tmp_path):
    with pytest.raises(SystemExit) as stop:
        spec_bench_checkout(str(tmp_path / "nowhere"))
    assert str(stop.value) == (f"no Spec-Bench checkout in {tmp_path / 'nowhere'}: git clone "
                               f"https://github.com/hemingkx/Spec-Bench {tmp_path / 'nowhere'} (or --spec-bench DIR)")


def test_decode_step_lengths_leave_out_the_prefill_whether_or_not_the_engine_books_it():
    assert decode_step_lengths(SimpleNamespace(tokens=[5, 6, 7, 8], accept_lengths=[1, 2, 1])) == [2, 1]
    assert decode_step_lengths(SimpleNamespace(tokens=[5, 6, 7, 8], accept_lengths=[2, 1])) == [2, 1]
