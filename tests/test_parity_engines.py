"""bench/parity/engines.py's comparison (python -m bench.parity.engines): the commands it runs for one head in two
engines, and how it compares their acceptance on the turns both engines wrote alike (records made up here)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.parity.engines import (
    accepting_steps_agree,
    bench_command,
    flag_gaps,
    parse_args,
    shared_rows,
    shared_text,
    step_starts,
)


def write_answers(folder, turns: list[tuple[list[int], list[int]]], question_id: int = 1) -> None:
    """One answer record whose turns have these (token ids, step lengths)."""
    folder.mkdir(parents=True)
    choice = {"token_ids": [ids for ids, _ in turns], "decoding_steps": [len(steps) for _, steps in turns],
              "accept_lengths": [n for _, steps in turns for n in steps]}
    (folder / "answers.jsonl").write_text(json.dumps({"question_id": question_id, "choices": [choice]}) + "\n")


def test_eagle_chain_of_k_counts_its_knobs_as_upstream():
    command = bench_command(parse_args(["--k", "3"]), "eagle3", "ours")
    assert {"method=eagle3", "method.drafter.depth=2", "method.drafter.top_k=1",
            "method.drafter.total_token=4"} <= set(command)
    server = bench_command(parse_args(["--k", "3"]), "eagle3", "vllm")
    assert "server.num_speculative_tokens=3" in server and "gen.temperature=0" in server


def test_suffix_drafts_a_chain_of_up_to_k_in_both_engines():
    ours = bench_command(parse_args(["--k", "24"]), "suffix", "ours")
    assert {"method=suffix", "method.drafter.num_speculative_tokens=24", "method.drafter.use_tree_spec=false"} <= \
        set(ours)
    assert {"server=vllm_cpu_suffix", "server.num_speculative_tokens=24"} <= set(
        bench_command(parse_args(["--k", "24"]), "suffix", "vllm"))


def test_pard_drafts_k_from_one_forward_in_both_engines():
    assert "method.drafter.num_draft_tokens=2" in bench_command(parse_args(["--k", "2"]), "pard", "ours")
    assert {"server=vllm_cpu_pard", "server.num_speculative_tokens=2"} <= set(
        bench_command(parse_args(["--k", "2"]), "pard", "vllm"))


def test_dflash_drafts_a_block_of_k_plus_1_from_the_same_published_copy_in_both_engines(monkeypatch, tmp_path):
    import bench.parity.engines as cross_engine

    monkeypatch.setattr(cross_engine, "dflash_published", lambda model: tmp_path / f"{model}-published")
    ours = bench_command(parse_args(["--k", "3"]), "dflash", "ours")
    assert {"method=dflash", f"method.drafter.checkpoint={tmp_path}/smollm2_135m-published",
            "method.drafter.block_size=4"} <= set(ours)
    assert {"server=vllm_cpu_dflash", f"server.draft={tmp_path}/smollm2_135m-published",
            "server.num_speculative_tokens=3"} <= set(bench_command(parse_args(["--k", "3"]), "dflash", "vllm"))


def test_step_starts_leave_out_the_last_step():
    assert step_starts([3, 1, 2, 3], 10) == {1: 3, 4: 1, 5: 2}  # the prefill's token at position 0


def test_shared_text_compares_only_turns_written_alike(tmp_path):
    same, other = list(range(10)), list(range(9)) + [99]
    write_answers(tmp_path / "ours", [(same, [1, 3, 1, 2, 3]), (other, [1, 4, 4, 1])])
    write_answers(tmp_path / "vllm", [(same, [1, 3, 2, 2, 1, 1]), (same, [1, 9])])
    alike, turns, accepts, (shared, agreed) = shared_text(tmp_path / "ours", tmp_path / "vllm")
    assert (alike, turns) == (1, 2)
    assert accepts == {"ours": [2, 0, 1, 2], "vllm": [2, 1, 1, 0, 0]}
    assert (shared, agreed) == (2, 1)  # steps at 1 (3 and 3) and 4 (1 and 2); at 5 and 6 only one engine's
    rows = pd.DataFrame(shared_rows("eagle3", accepts, 2))
    assert rows.pos1.tolist() == [0.75, 0.6] and rows.pos2.tolist() == [0.5, 0.2]
    assert rows["#MAT"].tolist() == [2.25, 1.8]
    assert flag_gaps(rows, 2, 0.2) == ["eagle3: position 2 accepted at 0.500 in ours, 0.200 in vLLM (-0.300) on "
                                       "the same text"]
    assert flag_gaps(rows, 2, 0.31) == []


def test_accepting_steps_are_compared_in_order_wherever_the_empty_steps_fell(tmp_path):
    """vLLM lists the steps that drafted first: the accepting steps 3, 2 in order agree; the last one (4 against 5,
    cut at the length limit) is left out; a turn of other text is not compared."""
    same = list(range(12))
    write_answers(tmp_path / "ours", [(same, [1, 1, 3, 1, 2, 4]), (same, [2, 1, 3]), (same[:3], [1, 2])])
    write_answers(tmp_path / "vllm", [(same, [3, 2, 5, 1, 1, 1]), (same, [3, 1, 2]), (same[:2] + [9], [1, 2])])
    assert accepting_steps_agree(tmp_path / "ours", tmp_path / "vllm") == (2, 1)


def overall_board(device: str, dtype: str, rows: dict[str, tuple[float, float, float, float]]) -> pd.DataFrame:
    """A record's board of one setting: per method (tokens/s, vanilla tokens/s, #MAT, speedup), overall only."""
    return pd.DataFrame([{"model": "m", "dtype": dtype, "device": device, "task": "overall", "method": method,
                          "tokens_per_s": tps, "baseline_tokens_per_s": base, "mean_accepted_tokens": mat,
                          "speedup": speedup} for method, (tps, base, mat, speedup) in rows.items()])


def test_step_cost_puts_both_engines_speedups_on_vllm_s_step_cost():
    """Ours: vanilla 25 ms a step, SpS 75 ms a step at #MAT 1.5 (0.5x); vLLM: vanilla 50 ms (25 ms more a step),
    0.75x. At vLLM's step cost ours is 1.5 x (25 + 25) / (75 + 25) = 0.75x: no gap left. A head run in one engine
    only (pld), or at another dtype, has no row."""
    from bench.report.step_cost import step_cost_table, step_cost_text

    settings = [overall_board("cpu", "float32", {"sps": (20.0, 40.0, 1.5, 0.5), "pld": (60.0, 40.0, 1.6, 1.5)}),
                overall_board("server:vllm", "float32", {"vllm_cpu_draft": (15.0, 20.0, 1.5, 0.75)}),
                overall_board("server:vllm", "bfloat16", {"vllm_cpu_ngram": (30.0, 20.0, 1.6, 1.5)})]
    table = step_cost_table(settings)
    assert table[["model", "head"]].values.tolist() == [["m (float32)", "sps"]]
    row = table.iloc[0]
    assert row["vanilla step ours (ms)"] == pytest.approx(25.0) and row["vanilla step vLLM (ms)"] == pytest.approx(50)
    assert row["vLLM's extra per step (ms)"] == pytest.approx(25.0)
    assert row["ours at vLLM's step cost"] == pytest.approx(0.75)
    assert row["gap"] == pytest.approx(0.5 / 0.75 - 1)
    assert row["gap at vLLM's step cost"] == pytest.approx(0.0)
    shown = step_cost_text(table).iloc[0]
    assert (shown["gap"], shown["gap at vLLM's step cost"], shown["speedup ours"]) == ("-33%", "+0%", "0.50x")
