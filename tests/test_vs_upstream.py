"""The pure parts of benchmarks/vs_upstream.py and its drivers: Spec-Bench's prompt order, forwards counted from
accept lengths, SAM-Decoding's tree file as choices, the missing checkouts' messages, a row of the table, per-position
acceptance shares, ReDrafter's beam agreement."""
import json
from types import SimpleNamespace

import pytest

from benchmarks.redrafter_vs_upstream import beam_agreement
from benchmarks.upstream_driver import forwards_until_done, running_sums, spec_bench_order
from benchmarks.vs_upstream import (
    Comparison,
    acceptance_note,
    acceptance_shares,
    counted_output,
    decode_step_lengths,
    generate_recording,
    knob_text,
    recycle_tree_choices,
    required_checkout,
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


def test_counted_output_cuts_at_max_new_tokens_and_counts_forwards_until_then():
    out = SimpleNamespace(tokens=[5, 6, 7, 8, 9, 10], accept_lengths=[1, 3, 2])  # the prefill's token booked
    assert counted_output(out, 4) == ([5, 6, 7, 8], 2)  # the prefill (1 known), step 1 (4 known)
    assert counted_output(out, 6) == ([5, 6, 7, 8, 9, 10], 3)


def test_a_comparison_row_gives_both_mats_their_difference_and_the_first_divergence():
    row = Comparison("pard", "K=2", ours=[([1, 2, 3], 2), ([4, 5, 6, 7, 8], 4)], theirs=[([1, 2, 3], 3), ([4, 5], 1)])
    assert row.line() == "| pard | K=2 | 1.333 | 1.250 | +6.7% | no (prompt 1, token 2) |"
    same = Comparison("dflash", "block 16", ours=[([1, 2], 2)], theirs=[([1, 2], 2)])
    assert same.line() == "| dflash | block 16 | 1.000 | 1.000 | +0.0% | yes |"


def test_acceptance_shares_count_steps_accepting_at_least_each_position():
    # tokens per step 1, 2, 3, 1 (the bonus token included): 0, 1, 2, 0 drafts accepted
    assert acceptance_shares([[1, 2], [3, 1]], 3) == "0.500 / 0.250 / 0.000"
    assert acceptance_shares([], 2) == "0.000 / 0.000"
    ours = [SimpleNamespace(tokens=[1, 2, 3, 4], accept_lengths=[1, 3])]  # one step accepting 2 drafts
    assert acceptance_note("pard K=2", ours, [[2, 1]], 2, "pard_infer.py") == (
        "pard K=2: steps accepting >= 1 / 2 drafts: ours 1.000 / 1.000, pard_infer.py 0.500 / 0.000")


def test_a_missing_upstream_checkout_says_how_to_get_it(tmp_path):
    with pytest.raises(SystemExit) as stop:
        required_checkout(tmp_path, "pard/pard_infer.py", "git clone https://github.com/AMD-AGI/PARD {dir}")
    assert str(stop.value) == (f"no pard/pard_infer.py in {tmp_path}: git clone https://github.com/AMD-AGI/PARD "
                               f"{tmp_path}")
    (tmp_path / "pard").mkdir()
    (tmp_path / "pard" / "pard_infer.py").write_text("")
    assert required_checkout(tmp_path, "pard/pard_infer.py", "") == tmp_path


def test_beam_agreement_compares_first_beams_and_beams_where_both_drafted():
    ours = [{1: [[1, 2]], 3: [[3, 4]], 5: [[5, 6]]}, {1: [[7, 8]]}]
    theirs = [{1: [[1, 2]], 3: [[3, 9]], 4: [[4, 4]]}, {1: [[7, 0]]}]
    assert beam_agreement("4 x 4", ours, theirs) == ("redrafter 4 x 4: first beams equal 1/2, beams equal where both "
                                                     "drafted 1/3")


def test_generate_recording_keys_the_kept_searches_by_new_tokens_known_and_restores_the_drafter():
    import torch

    class Drafter:
        def propose(self, context, max_tokens):
            return [self.beams(context[-1], 2), self.beams(context[-1], 1)]

        def beams(self, root, length):
            return torch.full((1, length), root)

    class Engine:
        def generate(self, prompt, stop):
            return [drafter.propose(prompt + [7] * n, 4) for n in (0, 3)]

    drafter = Drafter()
    out, drafted = generate_recording(Engine(), drafter, [5], None, "beams", keep=lambda length: length == 2)
    assert drafted == {0: [[5, 5]], 3: [[7, 7]]}
    assert len(out) == 2 and out[1][1].tolist() == [[7]]
    assert "propose" not in vars(drafter) and "beams" not in vars(drafter)
