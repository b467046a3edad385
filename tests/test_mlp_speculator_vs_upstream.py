"""The pure parts of benchmarks/mlp_speculator_vs_upstream.py: vLLM's greedy rule for a chain, the drafts compared
where both sides drafted as deep, and a table row's counts."""
from benchmarks.mlp_speculator_vs_upstream import greedy_chain_verdict, same_drafts, table_row


def test_greedy_chain_verdict_keeps_drafts_until_the_first_mismatch_then_the_targets_token():
    assert greedy_chain_verdict([5, 7, 9], [5, 7, 1, 4]) == [5, 7, 1]
    assert greedy_chain_verdict([5, 7, 9], [6, 7, 9, 4]) == [6]
    assert greedy_chain_verdict([5, 7, 9], [5, 7, 9, 4]) == [5, 7, 9, 4]  # all kept: the bonus token
    assert greedy_chain_verdict([], [3]) == [3]


def test_same_drafts_compares_only_points_both_sides_drafted_as_deep():
    ours = [{"drafts": {1: [[4, 5, 6]], 3: [[7, 8, 9]], 9: [[1]]}}, {"drafts": {1: [[2, 2, 2], [2, 3, 4]]}}]
    theirs = [{"drafts": {1: [[4, 5, 6]], 3: [[7, 8, 0]], 5: [[1, 1, 1]], 9: [[1, 2, 3]]}},
              {"drafts": {1: [[2, 3, 4], [2, 2, 2]]}}]  # same sequences, another order: not equal
    assert same_drafts(ours, theirs) == (1, 3)


def test_table_row_counts_forwards_until_done_and_steps_accepting_each_position():
    # 1 + 3 + 1 + 2 = 7 tokens after 4 forwards (the prefill's token, then three steps); steps accept 2, 0, 1 drafts
    run = {"tokens": [1, 2, 3, 4, 5, 6, 7], "steps": [3, 1, 2], "drafts": {1: [[2, 3, 9]], 4: [[8, 8, 8]]}}
    other = {**run, "tokens": [1, 2, 3, 4, 5, 6, 0], "drafts": {1: [[2, 3, 9]], 4: [[5, 8, 8]]}}
    assert table_row("ours", [run], [run], 3) == "| ours | 1.750 | 0.667 / 0.333 / 0.000 | yes | 2/2 |"
    assert table_row("them", [other], [run], 3) == ("| them | 1.750 | 0.667 / 0.333 / 0.000 | no (prompt 0, token 6) "
                                                    "| 1/2 |")
