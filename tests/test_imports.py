"""bench.report's imports (bench/report/imports/): vLLM's `bench serve --save-result` JSON, AIPerf's
profile_export.jsonl and Spec-Bench's answer files as rows of one leaderboard beside our runs, with numbers worked
out by hand; and every bad file refused in one line naming the file and the field, exit status 2, nothing written.

The fixtures follow the upstream writers: vllm/benchmarks/serve.py's result_json (vllm-project/vllm), AIPerf's
MetricRecordInfo lines with its SpecDecodeAcceptanceRecord (ai-dynamo/aiperf: src/aiperf/common/models/
spec_decode_models.py, docs/tutorials/spec-decode-metrics.md, docs/tutorials/working-with-profile-exports.md), and
Spec-Bench's evaluation/eval.py answer lines (hemingkx/Spec-Bench)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench.report.__main__ import main
from bench.report.imports import load_imports
from bench.report.imports.spec_bench import rows as spec_bench_rows
from bench.report.regress import current_board
from tests.report_fixtures import method_run
from tests.test_report import table_rows

# vllm bench serve --save-result, with the server's speculation counters (1 + 5400 / 3000 = 2.8 tokens per draft;
# per position 0.8 + 0.6 + 0.4 = 1.8 accepted per draft); 10240 tokens in 40 s
VLLM_RESULT = {
    "date": "20261201-120000", "endpoint_type": "openai-chat", "backend": "openai-chat", "label": "eagle3-k3",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
    "num_prompts": 80, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 4, "duration": 40.0,
    "completed": 80, "failed": 0, "total_input_tokens": 40960, "total_output_tokens": 10240, "request_throughput": 2.0,
    "request_goodput": None, "output_throughput": 256.0, "total_token_throughput": 1280.0,
    "max_output_tokens_per_s": 300.0, "max_concurrent_requests": 4, "rtfx": 0.0,
    "spec_decode_acceptance_rate": 60.0, "spec_decode_acceptance_length": 2.8, "spec_decode_num_drafts": 3000,
    "spec_decode_draft_tokens": 9000, "spec_decode_accepted_tokens": 5400,
    "spec_decode_per_position_acceptance_rates": [0.8, 0.6, 0.4],
    "mean_ttft_ms": 50.0, "median_ttft_ms": 48.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 70.0,
    "mean_tpot_ms": 12.0, "median_tpot_ms": 12.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 15.0,
}


def aiperf_record(phase: str, osl: int, latency_ms: float, spec: dict | None = None, error: dict | None = None) -> dict:
    """A profile_export.jsonl line (AIPerf's MetricRecordInfo): metadata, metrics {tag: {value, unit}}, error, and
    the request's spec_decode_acceptance where the server reported one."""
    metrics = {"input_sequence_length": {"value": 550, "unit": "tokens"}}
    if error is None:
        metrics |= {"time_to_first_token": {"value": 25.0, "unit": "ms"},
                    "request_latency": {"value": latency_ms, "unit": "ms"},
                    "output_sequence_length": {"value": osl, "unit": "tokens"}}
    line = {"metadata": {"session_num": 0, "x_request_id": "7609a2e7", "conversation_id": "77aa5b0e", "turn_index": 0,
                         "request_start_ns": 1759813207532900363, "request_end_ns": 1759813209342900363,
                         "worker_id": "worker_1", "record_processor_id": "record_processor_1",
                         "benchmark_phase": phase, "was_cancelled": False},
            "metrics": metrics, "error": error}
    if spec is not None:
        steps, accepted = sum(spec.values()), sum(int(j) * n for j, n in spec.items())
        line["spec_decode_acceptance"] = {
            "engine": "vllm", "mean_acceptance_length": 1 + accepted / steps,
            "draft_acceptance_rate": accepted / (3 * steps), "acceptance_histogram": spec,
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": 3 * steps, "num_spec_steps": steps,
            "num_spec_tokens": 3}
        metrics |= {"spec_decode_acceptance_length": {"value": 1 + accepted / steps, "unit": "ratio"},
                    "spec_decode_steps": {"value": steps, "unit": "count"},
                    "spec_decode_accepted_draft_tokens": {"value": accepted, "unit": "tokens"},
                    "spec_decode_draft_tokens": {"value": 3 * steps, "unit": "tokens"}}
    return line


# two requests count: 181 tokens in 1.81 s (100 tok/s; 120 drafts accepted in 60 steps) and 101 in 2.02 s (50 tok/s;
# 50 in 50); a warm-up request and two failed ones do not
AIPERF_RECORDS = [
    aiperf_record("warmup", 10, 1.0, {"0": 1}),
    aiperf_record("profiling", 181, 1810.0, {"0": 10, "1": 5, "2": 20, "3": 25}),
    aiperf_record("profiling", 0, 0.0, error={"code": 500, "type": "ServerError", "message": "boom"}),
    {**aiperf_record("profiling", 0, 0.0, error={"code": 499, "type": "RequestCancellationError", "message": "c"}),
     "metrics": None},  # "null for failed requests" (working-with-profile-exports.md)
    aiperf_record("profiling", 101, 2020.0, {"0": 10, "1": 30, "2": 10}),
]
AIPERF_FOLDER = "Llama-3.1-8B-Instruct-openai-chat-concurrency1"  # AIPerf's artifact folder: the row's method


def spec_bench_line(qid: int, category: str, model_id: str, new_tokens: list[int], wall_time: list[float],
                    accept_lengths: list[int], turns: list[str] | None = None) -> dict:
    """An answer line as Spec-Bench's evaluation/eval.py writes it."""
    return {"question_id": qid, "category": category, "answer_id": f"a{qid}", "model_id": model_id,
            "choices": [{"index": 0, "turns": turns or [f"answer {k}" for k in range(len(new_tokens))],
                         "decoding_steps": [len(accept_lengths)], "new_tokens": new_tokens, "wall_time": wall_time,
                         "accept_lengths": accept_lengths}], "tstamp": 1.0}


EAGLE = "vicuna-7b-v1.3-eagle-float16"
VANILLA = "vicuna-7b-v1.3-vanilla-float16-temp-0.0"
# the method: MT-bench question 81, 32 tokens in 1.6 s (20 tok/s), 5 + 2 decode steps adding 4 and 5 tokens; QA
# question 321, 31 tokens in 1 s (31 tok/s), 10 steps of 3. Vanilla: 10 tok/s on both (by their new_tokens); by
# their text (16 + 8 words for question 81, 31 for question 321) 7.5 and 10 tok/s.
SPEC_BENCH_METHOD = [spec_bench_line(81, "writing", EAGLE, [21, 11], [1.0, 0.6], [4] * 5 + [5] * 2),
                     spec_bench_line(321, "qa", EAGLE, [31], [1.0], [3] * 10)]
SPEC_BENCH_BASELINE = [spec_bench_line(81, "writing", VANILLA, [21, 11], [2.0, 1.2], [1] * 32,
                                       ["w " * 16, "w " * 8]),
                       spec_bench_line(321, "qa", VANILLA, [31], [3.1], [1] * 31, ["w " * 31])]


def write_lines(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """One of our runs (pld: QA 4x, RAG 1x faster than its vanilla at 12 tok/s) and a file of each format."""
    method_run(tmp_path / "runs" / "pld", "pld", {321: 4.0, 481: 1.0}, [3, 3, 3, 2])
    vllm = tmp_path / "vllm" / "openai-chat-infqps-concurrency4-Llama-3.1-8B-Instruct-20261201-120000.json"
    vllm.parent.mkdir()
    vllm.write_text(json.dumps(VLLM_RESULT))
    return {"runs": tmp_path / "runs", "vllm": vllm,
            "aiperf": write_lines(tmp_path / "artifacts" / AIPERF_FOLDER / "profile_export.jsonl", AIPERF_RECORDS),
            "method": write_lines(tmp_path / "model_answer" / f"{EAGLE}.jsonl", SPEC_BENCH_METHOD),
            "baseline": write_lines(tmp_path / "model_answer" / f"{VANILLA}.jsonl", SPEC_BENCH_BASELINE)}


def import_args(files: dict[str, Path]) -> list[str]:
    return ["--vllm-bench-serve", str(files["vllm"]), "--aiperf", str(files["aiperf"]),
            "--spec-bench", str(files["method"]), "--spec-bench-baseline", str(files["baseline"])]


def sources_rows(out: Path) -> list[list[str]]:
    """The cells of leaderboard.md's table of all sources."""
    text = (out / "leaderboard.md").read_text()
    return table_rows(text[text.index("## All sources side by side"):])


# --- every source, one leaderboard -----------------------------------------------------------------------------------

def test_every_source_is_a_row_of_one_leaderboard_beside_our_run(files, tmp_path):
    out = tmp_path / "report"
    main([str(files["runs"]), "--out", str(out), *import_args(files)])
    rows = sources_rows(out)
    assert rows[0] == ["Method", "Source", "Setting", "Multi-turn Conversation", "Question Answering",
                       "Retrieval-aug. Generation", "#Mean Accepted Tokens", "Overall", "vanilla tok/s", "tok/s"]
    assert rows[2:] == [
        # Spec-Bench: MT-bench 20 / 10 tok/s, QA 31 / 10; overall mean(20, 31) / mean(10, 10); #MAT 30/7, 3, 60/17
        [EAGLE, "spec-bench", "—", "2.00x", "3.10x", "—", "3.53", "2.55x", "10.0", "25.5"],
        # ours: 48 and 12 tok/s over vanilla's 12 (qa 4x, rag 1x): 2.5x overall; 11 tokens in 4 steps
        ["pld", "specbench", "m · cpu · bfloat16 · max_new_tokens 32", "—", "4.00x", "1.00x", "2.75",
         "2.50x (1.00-4.00)", "12.0", "30.0"],
        # vLLM: no baseline, so no speedup; its output_throughput and acceptance length
        ["eagle3-k3", "vllm-bench-serve", "meta-llama/Llama-3.1-8B-Instruct · batch 4", "—", "—", "—", "2.80", "—",
         "—", "256.0"],
        # AIPerf: mean of 100 and 50 tok/s; 1 + (120 + 50) / (60 + 50) tokens per step
        [AIPERF_FOLDER, "aiperf", "—", "—", "—", "—", "2.55", "—", "—", "75.0"],
    ]
    text = (out / "leaderboard.md").read_text()
    assert (f"Imported: vllm-bench-serve: {files['vllm']}; aiperf: {files['aiperf']}; spec-bench: {files['method']} "
            f"(baseline {files['baseline']}).") in text
    assert "All sources side by side" in (out / "index.html").read_text()


def test_the_csv_names_each_rows_source_and_leaves_what_a_source_lacks_empty(files, tmp_path):
    main([str(files["runs"]), "--out", str(tmp_path / "alone")])
    main([str(files["runs"]), "--out", str(tmp_path / "report"), *import_args(files)])
    alone = pd.read_csv(tmp_path / "alone" / "leaderboard.csv")
    board = pd.read_csv(tmp_path / "report" / "leaderboard.csv")
    assert set(alone.source) == {"specbench"}
    ours = board[board.source == "specbench"].reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, alone, check_dtype=False)  # our rows as a report without imports has them
    overall = board[board.task == "overall"].set_index("source")
    vllm, aiperf, spec = overall.loc["vllm-bench-serve"], overall.loc["aiperf"], overall.loc["spec-bench"]
    assert (vllm.n_questions, vllm.new_tokens, vllm.batch_size) == (80, 10240, 4)
    assert [vllm[f"accept_rate_pos{k}"] for k in (1, 2, 3)] == [0.8, 0.6, 0.4]
    assert math.isnan(vllm.accept_rate_pos4) and math.isnan(vllm.speedup) and math.isnan(vllm.exact_match)
    # AIPerf's pooled histogram {0: 20, 1: 35, 2: 30, 3: 25}: steps accepting at least 1, 2, 3, 4 drafts
    assert [aiperf[f"accept_rate_pos{k}"] for k in range(1, 6)] == pytest.approx([90 / 110, 55 / 110, 25 / 110, 0, 0])
    assert (aiperf.n_questions, aiperf.new_tokens, aiperf.mean_accepted_tokens) == (2, 282, pytest.approx(1 + 17 / 11))
    assert math.isnan(aiperf.model) and math.isnan(aiperf.speedup) and math.isnan(aiperf.baseline_tokens_per_s)
    assert (spec.n_questions, spec.new_tokens, spec.speedup) == (2, 63, pytest.approx(2.55))
    assert math.isnan(spec.speedup_ci_low) and math.isnan(spec.accept_rate_pos1)
    tasks = board[board.source == "spec-bench"].set_index("task")
    assert tasks.loc["mt_bench", "mean_accepted_tokens"] == pytest.approx(30 / 7)
    assert set(tasks.index) == {"mt_bench", "qa", "overall"}
    assert set(current_board(tmp_path / "report").source) == {"specbench"}  # the regression gate reads ours only


def test_spec_bench_speedup_is_speed_pys_with_or_without_a_tokenizer(files):
    class Words:  # a tokenizer that makes a token of each word and adds one BOS, as speed.py assumes
        def __call__(self, text):
            return type("Encoding", (), {"input_ids": [0, *text.split()]})()

    by_task = {r.task: r for r in spec_bench_rows(files["method"], files["baseline"], Words())}
    assert by_task["mt_bench"].baseline_tokens_per_s == pytest.approx(24 / 3.2)  # 16 + 8 words in 3.2 s
    assert by_task["mt_bench"].speedup == pytest.approx(20 / 7.5)
    assert by_task["overall"].speedup == pytest.approx(25.5 / ((7.5 + 10) / 2))
    by_task = {r.task: r for r in spec_bench_rows(files["method"], files["baseline"])}  # by new_tokens: 10 tok/s
    assert by_task["qa"].speedup == pytest.approx(3.1) and by_task["mt_bench"].speedup == pytest.approx(2.0)
    unpaired = {r.task: r for r in spec_bench_rows(files["method"], None)}  # no baseline: no speedup
    assert math.isnan(unpaired["overall"].speedup) and unpaired["overall"].tokens_per_s == pytest.approx(25.5)


def test_aiperf_acceptance_from_the_metrics_alone(tmp_path):
    """Records without the spec_decode_acceptance struct: #MAT from the spec_decode_* metrics, no positions."""
    records = [{k: v for k, v in r.items() if k != "spec_decode_acceptance"} for r in AIPERF_RECORDS]
    path = write_lines(tmp_path / "run" / "profile_export.jsonl", records)
    (row,) = load_imports(aiperf=[path]).to_dict("records")
    assert row["mean_accepted_tokens"] == pytest.approx(1 + 170 / 110) and row["tokens_per_s"] == pytest.approx(75)
    assert "accept_rate_pos1" not in row and row["method"] == "run"


def test_vllm_appended_results_are_a_row_each(tmp_path):
    """`vllm bench serve --append-result` writes one result per line: two concurrencies, two rows."""
    path = write_lines(tmp_path / "sweep.json", [VLLM_RESULT, {**VLLM_RESULT, "max_concurrency": 1,
                                                               "output_throughput": 90.0}])
    board = load_imports(vllm=[path])
    assert board[["runs", "batch_size", "tokens_per_s"]].values.tolist() == [
        [f"{path} line 1", 4, 256.0], [f"{path} line 2", 1, 90.0]]
    assert board.setting.nunique() == 2  # never pooled


def test_imports_alone_make_a_leaderboard(files, tmp_path):
    (tmp_path / "empty").mkdir()
    main([str(tmp_path / "empty"), "--out", str(tmp_path / "report"), "--vllm-bench-serve", str(files["vllm"])])
    assert [r[:2] for r in sources_rows(tmp_path / "report")[2:]] == [["eagle3-k3", "vllm-bench-serve"]]


# --- bad inputs ------------------------------------------------------------------------------------------------------

def vllm_without(key: str) -> dict:
    return {k: v for k, v in VLLM_RESULT.items() if k != key}


def aiperf_lines(**changes) -> list[dict]:
    """AIPERF_RECORDS with the second line's metrics changed (a value None: left out)."""
    records = json.loads(json.dumps(AIPERF_RECORDS))
    for name, value in changes.items():
        records[1]["metrics"].pop(name) if value is None else records[1]["metrics"].update({name: value})
    return records


BAD_INPUTS = {  # flag, file name, content (an object: JSON; a list: JSON lines), the message after the file's path
    "aiperf export passed as vLLM's": ("--vllm-bench-serve", "profile_export.jsonl", AIPERF_RECORDS,
                                       " line 1: not a vLLM bench serve result (vllm bench serve --save-result): no "
                                       "field model_id"),
    "vLLM result without throughput": ("--vllm-bench-serve", "embed.json", vllm_without("output_throughput"),
                                       ": not a vLLM bench serve result (vllm bench serve --save-result): no field "
                                       "output_throughput"),
    "vLLM throughput not a number": ("--vllm-bench-serve", "r.json", {**VLLM_RESULT, "output_throughput": "fast"},
                                     ": output_throughput is not a number: 'fast'"),
    "vLLM speculation without its length": ("--vllm-bench-serve", "r.json",
                                            vllm_without("spec_decode_acceptance_length"),
                                            ": not a vLLM bench serve result (vllm bench serve --save-result): no "
                                            "field spec_decode_acceptance_length"),
    "vLLM result passed as AIPerf's": ("--aiperf", "r.jsonl", [VLLM_RESULT],
                                       " line 1: not an AIPerf profile_export.jsonl record: no field metadata"),
    "AIPerf record without latency": ("--aiperf", "profile_export.jsonl", aiperf_lines(request_latency=None),
                                      " line 2: not an AIPerf profile_export.jsonl record: no field "
                                      "metrics.request_latency.value"),
    "AIPerf latency in an unknown unit": ("--aiperf", "profile_export.jsonl",
                                          aiperf_lines(request_latency={"value": 3, "unit": "fortnights"}),
                                          " line 2: metrics.request_latency.unit is 'fortnights', not one of ns, us, "
                                          "ms, s, sec"),
    "AIPerf export of failures only": ("--aiperf", "profile_export.jsonl", AIPERF_RECORDS[:1] + AIPERF_RECORDS[2:4],
                                       ": no completed request of the profiling phase (every record failed, was "
                                       "cancelled or warmed up)"),
    "Spec-Bench line without accept lengths": ("--spec-bench", "m.jsonl",
                                               [{**SPEC_BENCH_METHOD[0], "choices": [
                                                   {k: v for k, v in SPEC_BENCH_METHOD[0]["choices"][0].items()
                                                    if k != "accept_lengths"}]}],
                                               " line 1: not a Spec-Bench answer line: no field "
                                               "choices[0].accept_lengths"),
    "summary.csv passed as Spec-Bench's": ("--spec-bench", "summary.csv", "task,speedup\nqa,1.5\n",
                                           " line 1: not a Spec-Bench answer line: not JSON (Expecting value)"),
    "empty file": ("--spec-bench", "m.jsonl", "", ": empty file"),
}


def write_input(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, list):
        return write_lines(path, content)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def refused(argv: list[str], capsys) -> str:
    """The one stderr line of a command that must exit with status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_file_is_refused_in_one_line_and_nothing_is_written(case, files, tmp_path, capsys):
    flag, name, content, message = BAD_INPUTS[case]
    out = tmp_path / "report"
    main([str(files["runs"]), "--out", str(out)])  # an earlier report, which must stay as it is
    before, runs_before = snapshot(out), snapshot(files["runs"])
    bad = write_input(tmp_path / "bad" / name, content)
    assert refused([str(files["runs"]), "--out", str(out), flag, str(bad)], capsys) == f"error: {bad}{message}"
    assert snapshot(out) == before and snapshot(files["runs"]) == runs_before


def test_a_missing_file_and_a_baseline_alone_are_refused(files, tmp_path, capsys):
    runs, out, missing = str(files["runs"]), tmp_path / "report", tmp_path / "nowhere.json"
    assert refused([runs, "--out", str(out), "--vllm-bench-serve", str(missing)], capsys) == \
        f"error: {missing}: no such file"
    assert refused([runs, "--out", str(out), "--spec-bench-baseline", str(files["baseline"])], capsys) == \
        "error: --spec-bench-baseline: no --spec-bench answer file to compare with it"
    assert not out.exists()
