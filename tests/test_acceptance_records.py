"""Per-request acceptance records (AIPerf's shape), their invariants, and the aggregates that rank methods apart."""
from __future__ import annotations

import json
import math

import pytest

from bench.measure.acceptance import (
    AIPERF_FIELDS,
    AcceptanceRecordError,
    acceptance_aggregates,
    aiperf_export,
    bin_label,
    read_acceptance,
    request_records,
    step_table,
    write_acceptance,
)
from bench.measure.metrics import mean_accepted_tokens


def answer(question_id: int, turns: list[list[int]], drafted: list[list[int]] | None = None,
           prompt_tokens: int = 10) -> dict:
    """An answer record whose turns took decode steps of these accept lengths (and drafted these nodes)."""
    choice = {"decoding_steps": [len(t) for t in turns], "accept_lengths": [a for t in turns for a in t],
              "new_tokens": [1 + sum(t) for t in turns], "prompt_tokens": [prompt_tokens] * len(turns)}
    if drafted is not None:
        choice["drafted_tokens"] = drafted
    return {"question_id": question_id, "category": "qa", "choices": [choice]}


def test_a_request_counts_drafted_steps_as_aiperf_does_and_every_step_beside():
    record = answer(7, [[3, 1, 1, 2]], drafted=[[3, 0, 2, 2]])  # the second step drafted nothing
    (request,) = request_records([record], "m")
    assert request == {
        "request_id": "7-0", "question_id": 7, "turn": 0, "category": "qa", "method": "m", "engine": "specbench",
        "completion_tokens": 8, "num_decode_steps": 4, "steps_without_draft": 1,
        "per_step_accepted": [2, 0, 1], "per_step_drafted": [3, 2, 2], "per_step_context": [10, 14, 15],
        "acceptance_histogram": {0: 1, 1: 1, 2: 1}, "num_accepted_draft_tokens": 3, "num_draft_tokens": 7,
        "num_spec_steps": 3, "num_spec_tokens": None, "mean_acceptance_length": 2.0, "draft_acceptance_rate": 3 / 7,
    }
    aggregates = acceptance_aggregates([record])
    assert mean_accepted_tokens([record]) == 7 / 4  # Spec-Bench's: every decode step
    assert aggregates == {"mean_accepted_tokens_per_request": 7 / 4, "accept_length_drafted_steps": 2.0,
                          "draft_acceptance_rate": 3 / 7, "steps_without_draft_share": 1 / 4, "draft_k": 3}
    assert step_table([record]) == [{"context": 10, "position": 0, "drafted": 3, "accepted": 2},
                                    {"context": 13, "position": 3, "drafted": 0, "accepted": 0},
                                    {"context": 14, "position": 4, "drafted": 2, "accepted": 0},
                                    {"context": 15, "position": 5, "drafted": 2, "accepted": 1}]


def test_pooled_and_per_request_means_can_rank_two_methods_in_opposite_order():
    one_long_step = [answer(1, [[5], [1, 1, 1, 1]], drafted=[[4], [4, 4, 4, 4]])]
    steady = [answer(1, [[2, 2], [2, 2]], drafted=[[4, 4], [4, 4]])]
    assert mean_accepted_tokens(one_long_step) == 9 / 5 < mean_accepted_tokens(steady) == 2.0
    assert acceptance_aggregates(one_long_step)["mean_accepted_tokens_per_request"] == 3.0
    assert acceptance_aggregates(steady)["mean_accepted_tokens_per_request"] == 2.0
    (fixed, *_) = request_records(steady, "steady")
    assert fixed["num_spec_tokens"] == 4  # every drafted step drafted 4: a fixed k


def test_vanilla_and_older_records_leave_unknown_counts_empty_and_are_not_exported():
    vanilla = answer(3, [[1, 1, 1]], drafted=[[0, 0, 0]])
    older = answer(4, [[2, 1]])  # written before drafted_tokens was recorded
    requests = request_records([vanilla, older], "m")
    assert requests[0]["num_spec_steps"] == 0 and requests[0]["steps_without_draft"] == 3
    assert requests[0]["mean_acceptance_length"] is None and requests[0]["draft_acceptance_rate"] is None
    assert requests[1]["acceptance_histogram"] is None and requests[1]["num_draft_tokens"] is None
    exported, left_out = aiperf_export(requests)
    assert exported == [] and left_out == 2
    assert math.isnan(acceptance_aggregates([older])["draft_acceptance_rate"])


def test_the_export_holds_aiperfs_fields_with_string_histogram_keys_as_on_the_wire():
    requests = request_records([answer(5, [[3, 2]], drafted=[[2, 2]])], "m")
    (exported,), left_out = aiperf_export(requests)
    assert left_out == 0 and tuple(exported) == AIPERF_FIELDS
    assert exported["acceptance_histogram"] == {"2": 1, "1": 1} and exported["num_spec_tokens"] == 2
    assert exported["mean_acceptance_length"] == 2.5 and exported["draft_acceptance_rate"] == 0.75


def test_a_record_that_breaks_an_invariant_is_refused_naming_the_request_and_the_invariant(tmp_path):
    path = write_acceptance(tmp_path, [answer(81, [[3, 1, 2]], drafted=[[2, 1, 1]])], "m")
    assert len(read_acceptance(path)) == 1
    record = json.loads(path.read_text())
    record["acceptance_histogram"] = {"2": 1, "1": 1}  # one step short of num_spec_steps
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(AcceptanceRecordError) as refused:
        read_acceptance(path)
    assert str(refused.value) == (f"{path} line 1: request 81-0: acceptance_histogram counts sum to 2, but "
                                  f"num_spec_steps is 3")
    record.update(acceptance_histogram={"2": 1, "1": 1, "0": 1}, num_draft_tokens=2)
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(AcceptanceRecordError, match=r"request 81-0: num_accepted_draft_tokens \(3\) exceeds "
                                                    r"num_draft_tokens \(2\)"):
        read_acceptance(path)


def test_bins_name_their_bounds():
    edges = (1024, 2048, 4096)
    assert [bin_label(v, edges) for v in (0, 1023, 1024, 2047, 4095, 4096)] == \
        ["<1024", "<1024", "1024-2047", "1024-2047", "2048-4095", ">=4096"]


def test_the_report_exports_our_runs_as_aiperf_records_that_read_back_with_the_same_acceptance(tmp_path):
    from bench.report.imports.aiperf import rows as aiperf_rows
    from bench.report.render import write_report
    from tests.report_fixtures import QUESTIONS, method_run

    method_run(tmp_path / "runs" / "sps", "sps", {q: 2.0 for q, _ in QUESTIONS}, [4, 4, 3], drafted=[3, 3, 3])
    board = write_report(tmp_path / "runs", tmp_path / "report")
    (path,) = (tmp_path / "report" / "aiperf").rglob("profile_export.jsonl")
    assert path.parent.name == "sps"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 7  # six questions, the MT-bench one with two turns
    assert lines[0]["spec_decode_acceptance"]["acceptance_histogram"] == {"3": 2, "2": 1}
    assert lines[0]["metrics"]["output_sequence_length"] == {"value": 12, "unit": "tokens"}
    (row,) = aiperf_rows(path)
    overall = board[(board.method == "sps") & (board.task == "overall")].iloc[0]
    assert row.mean_accepted_tokens == pytest.approx(overall.accept_length_drafted_steps) == 1 + 8 / 3
    assert row.n_questions == 7 and row.new_tokens == 7 * 12
