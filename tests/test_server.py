"""backend=server (bench/measure/backends/server.py): records in our engine's layout from fake OpenAI-compatible engines
(tests/fake_server.py) on localhost, exact_match against a baseline engine, acceptance from llama.cpp's timings and
vLLM's /metrics, NaN where nothing is reported, concurrency, launched servers, one-line errors."""
from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import ExitStack

import pandas as pd
import pytest
from transformers import AutoTokenizer

from bench.artifacts import PROJECT_ROOT
from bench.errors import ConfigError, MissingArtifactError
from bench.measure.metrics import summarize
from bench.measure.run import run
from bench.measure.serving.acceptance import parse_counters
from bench.records import read_jsonl
from tasks.prompts import build_prompt
from tests.conftest import assert_acceptance_records_match
from tests.fake_server import FakeEngine, FakeServer, speculate

MAX_NEW = 12  # conftest.tiny_overrides' gen.max_new_tokens


@pytest.fixture
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def serve(stack: ExitStack, tokenizer, **knobs) -> str:
    """A fake engine decoding its text with the tiny tokenizer, served for the test; its url."""
    return stack.enter_context(FakeServer(FakeEngine(decode=tokenizer.decode, **knobs))).url


def server_args(config: str, url: str, base_url: str | None, *more: str) -> list[str]:
    return ["backend=server", f"server={config}", f"server.url={url}", f"server.baseline_url={base_url}",
            "server.launch=null", "server.baseline_launch=null", *more]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports nothing listens on (held open together while chosen, so they differ)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def refuses(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=5)
    except urllib.error.URLError as err:
        return isinstance(err.reason, ConnectionRefusedError)
    return False


def test_a_server_runs_concurrency_is_its_reported_batch_size():
    from bench.report.runs import run_setting

    config = {"backend": "server", "server": {"concurrency": 4}, "model": {"name": "m"},
              "gen": {"max_new_tokens": 8, "temperature": 0.0, "batch_size": 1}}
    assert run_setting({"config": config, "device": "server:llamacpp", "dtype": "Q4_1"})["batch_size"] == 4
    assert run_setting({"config": {**config, "backend": "engine"}, "device": "cpu"})["batch_size"] == 1


def test_llamacpp_timings_without_draft_fields_mean_nothing_was_drafted():
    from bench.measure.serving.acceptance import from_timings

    assert from_timings(17, {"predicted_n": 17, "predicted_ms": 140.0}) == {
        "decode_steps": 16, "accept_lengths": [], "acceptance_source": "llamacpp_timings", "drafted": 0, "accepted": 0}
    assert from_timings(20, {"predicted_n": 20, "draft_n": 9, "draft_n_accepted": 6})["decode_steps"] == 13
    assert from_timings(20, None) is None and from_timings(20, {}) is None


def test_llamacpp_records_exact_tokens_acceptance_and_exact_match(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec = serve(stack, tokenizer, timings=True)
        base_url = serve(stack, tokenizer)
        summary = run(compose(*server_args("llamacpp_ngram", spec, base_url), "task=qa", "task.limit=2"))
    out = tmp_path / "run"
    answers, baseline = read_jsonl(out / "answers.jsonl"), read_jsonl(out / "baseline.jsonl")
    assert [a["question_id"] for a in answers] == [b["question_id"] for b in baseline] and len(answers) == 2
    accepted = sum(speculate(MAX_NEW))  # 2+0+1+2+0+0 = 5 of the fake's pattern
    for answer, base in zip(answers, baseline):
        choice = answer["choices"][0]
        assert answer["method"] == "llamacpp_ngram" and base["method"] == "vanilla"
        assert choice["new_tokens"] == [MAX_NEW] and choice["token_count_source"] == ["engine"]
        assert choice["decoding_steps"] == [MAX_NEW - 1 - accepted] and choice["accept_lengths"] == []
        assert choice["acceptance_source"] == ["llamacpp_timings"] and choice["accepted"] == [accepted]
        assert choice["turns"] == [tokenizer.decode(choice["token_ids"][0]).strip()]
        assert choice["ttft_s"][0] > 0 and len(choice["itl_s"][0]) == MAX_NEW - 1
        assert choice["wall_time"] == choice["latency"] and choice["group"]["concurrency"] == 1
        assert answer["exact_match"] is True and answer["divergence"] is None
        assert base["choices"][0]["decoding_steps"] == [MAX_NEW - 1]  # no speculation: one token a step
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / (MAX_NEW - 1 - accepted))
    assert math.isnan(overall.accept_rate_pos1)  # llama.cpp's timings have no per-step lengths
    assert overall.exact_match == 1.0 and overall.concurrency == 1
    for column in ("ttft_p50_s", "ttft_p99_s", "itl_p90_s", "e2e_p50_s", "output_tokens_per_s"):
        assert overall[column] > 0
    csv = pd.read_csv(out / "summary.csv")
    assert {"ttft_p90_s", "itl_p99_s", "e2e_p99_s", "output_tokens_per_s", "baseline_output_tokens_per_s"} <= set(csv)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["backend"] == "server" and meta["server"]["url"] == spec and meta["server"]["baseline_url"] == base_url
    assert meta["server"]["engine"] == "llamacpp" and meta["server"]["concurrency"] == 1
    assert meta["config"]["method"]["name"] == "llamacpp_ngram" and meta["device"] == "server:llamacpp"
    for request in assert_acceptance_records_match(out):  # llama.cpp's timings: totals, no per-step lengths
        assert request["engine"] == "llamacpp" and request["num_accepted_draft_tokens"] == accepted
        assert request["acceptance_histogram"] is None and request["draft_acceptance_rate"] == pytest.approx(
            accepted / request["num_draft_tokens"])


def test_turn_two_is_asked_with_turn_one_answer(compose, tokenizer):
    engine = FakeEngine(decode=tokenizer.decode)
    with FakeServer(engine) as server:
        run(compose(*server_args("llamacpp_ngram", server.url, None), "server.speculative=false",
                    "task=mt_bench", "task.limit=1", "warmup_tokens=0"))
    first, second = engine.bodies
    from tasks import load_questions
    question = load_questions(compose("task=mt_bench", "task.limit=1").task)[0]
    answer = tokenizer.decode(engine.tokens(first["prompt"], MAX_NEW)).strip()
    conversation = [{"role": "user", "content": question["turns"][0]}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": question["turns"][1]}]
    assert first["prompt"] == build_prompt(tokenizer, conversation[:1])
    assert second["prompt"] == build_prompt(tokenizer, conversation)
    assert second["n_predict"] == MAX_NEW and second["stream"] is True and second["temperature"] == 0.0


def test_a_differing_engine_is_not_exact_and_the_position_is_located(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec, base_url = serve(stack, tokenizer, bend_at=3), serve(stack, tokenizer)
        summary = run(compose(*server_args("llamacpp_ngram", spec, base_url), "task=qa", "task.limit=1"))
    answer = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]
    ours, theirs = answer["choices"][0]["token_ids"][0], read_jsonl(tmp_path / "run" / "baseline.jsonl")[0][
        "choices"][0]["token_ids"][0]
    divergence = answer["divergence"]
    assert answer["exact_match"] is False and divergence["turn"] == 0 and divergence["position"] == 3
    assert divergence["method_token"] == ours[3] == (theirs[3] + 1) % 300 and divergence["vanilla_token"] == theirs[3]
    assert divergence["numeric_tie"] is False and divergence["logit_gap"] is None
    assert "no logits" in divergence["reason"]
    assert summary.exact_match.iloc[-1] == 0.0 and summary.numeric_ties.iloc[-1] == 0


def test_vllm_acceptance_from_metrics_deltas(compose, tokenizer, tmp_path, capsys):
    with ExitStack() as stack:
        spec = serve(stack, tokenizer, counters="vllm:")
        summary = run(compose(*server_args("vllm", spec, serve(stack, tokenizer)), "task=qa", "task.limit=3"))
    accepts = speculate(MAX_NEW)  # [2, 0, 1, 2, 0, 0]
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert choice["acceptance_source"] == ["vllm_metrics"] and choice["decoding_steps"] == [len(accepts)]
        assert choice["accept_lengths"] == [3, 3, 2, 1, 1, 1]  # the decode steps by length
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / len(accepts))
    assert overall.accept_rate_pos1 == pytest.approx(3 / 6) and overall.accept_rate_pos2 == pytest.approx(2 / 6)
    assert overall.accept_rate_pos3 == 0.0
    counters = json.loads((tmp_path / "run" / "meta.json").read_text())["server"]["acceptance_counters"]
    assert counters["drafts"] == 3 * len(accepts) and counters["accepted"] == 3 * sum(accepts)  # warm-up left out
    assert counters["acceptance_length"] == pytest.approx(1 + sum(accepts) / len(accepts))
    assert overall.engine_acceptance_length == pytest.approx(1 + sum(accepts) / len(accepts))
    assert "server-wide" in capsys.readouterr().err


def test_llamacpp_per_position_acceptance_from_its_metrics_at_concurrency_1(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec = serve(stack, tokenizer, timings=True, counters="llamacpp:")
        summary = run(compose(*server_args("llamacpp_ngram", spec, serve(stack, tokenizer)), "task=qa",
                              "task.limit=2"))
    accepts = speculate(MAX_NEW)  # [2, 0, 1, 2, 0, 0]
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert choice["acceptance_source"] == ["llamacpp_metrics"] and choice["accepted"] == [sum(accepts)]
        assert choice["accept_lengths"] == [3, 3, 2, 1, 1, 1] and choice["decoding_steps"] == [6]
    overall = summary.iloc[-1]
    assert overall.accept_rate_pos1 == pytest.approx(3 / 6) and overall.accept_rate_pos2 == pytest.approx(2 / 6)
    assert overall.engine_acceptance_length == pytest.approx(1 + sum(accepts) / len(accepts))


def test_llamacpp_falls_back_to_its_timings_above_concurrency_1(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec = serve(stack, tokenizer, timings=True, counters="llamacpp:")
        run(compose(*server_args("llamacpp_ngram", spec, serve(stack, tokenizer)), "server.concurrency=2",
                    "task=qa", "task.limit=2"))
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert choice["acceptance_source"] == ["llamacpp_timings"] and choice["accept_lengths"] == []
        assert choice["decoding_steps"] == [6]


def test_counters_of_a_turn_that_drafted_nothing_give_one_token_steps():
    from bench.measure.serving.acceptance import SpecCounters, from_counters

    assert from_counters(5, SpecCounters(drafts=2.0), "llamacpp_metrics")["accept_lengths"] == [1] * 4
    assert from_counters(5, SpecCounters(), "llamacpp_metrics")["accept_lengths"] == [1] * 4
    leaked = SpecCounters(drafts=9.0, accepted=1.0, per_position={0: 1.0})  # more drafts than the turn had steps
    assert from_counters(5, leaked, "vllm_metrics")["accept_lengths"] == []


@pytest.mark.parametrize("fields, lengths", [("2026", [3, 3, 2, 1, 1, 1]), ("2025", []), ("verify", [])])
@pytest.mark.parametrize("incremental", [False, True])
def test_sglang_acceptance_from_generate_meta_info(compose, tokenizer, tmp_path, fields, lengths, incremental):
    engine = FakeEngine(decode=tokenizer.decode, sglang_fields=fields, incremental=incremental)
    with ExitStack() as stack:
        spec = stack.enter_context(FakeServer(engine)).url
        summary = run(compose(*server_args("sglang", spec, serve(stack, tokenizer)), "task=qa", "task.limit=2"))
    accepts = speculate(MAX_NEW)
    asked = [body for body in engine.bodies if body["sampling_params"]["max_new_tokens"] == MAX_NEW]
    for answer, body in zip(read_jsonl(tmp_path / "run" / "answers.jsonl"), asked, strict=True):
        choice = answer["choices"][0]
        assert body["path"] == "/generate" and body["stream"] is True and body["sampling_params"]["temperature"] == 0
        assert choice["token_ids"] == [engine.tokens(body["input_ids"], MAX_NEW)]
        assert choice["turns"] == [tokenizer.decode(choice["token_ids"][0]).strip()]
        assert choice["acceptance_source"] == ["sglang_meta_info"] and choice["decoding_steps"] == [6]
        assert choice["accepted"] == [sum(accepts)] and choice["accept_lengths"] == lengths
        assert len(choice["itl_s"][0]) == MAX_NEW - 1 and answer["exact_match"] is True
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / 6)
    assert (overall.accept_rate_pos1 == pytest.approx(0.5)) if lengths else math.isnan(overall.accept_rate_pos1)


def test_nothing_reported_gives_nan_not_a_number(compose, tokenizer, tmp_path):
    engine = FakeEngine(decode=tokenizer.decode, token_ids=False)  # text only: counted by our tokenizer
    with ExitStack() as stack:
        spec, base_url = stack.enter_context(FakeServer(engine)).url, serve(stack, tokenizer, token_ids=False)
        summary = run(compose(*server_args("vllm", spec, base_url), "server.engine=generic", "task=qa",
                              "task.limit=2"))
    asked = [body["prompt"] for body in engine.bodies if body["max_tokens"] == MAX_NEW]
    for answer, prompt in zip(read_jsonl(tmp_path / "run" / "answers.jsonl"), asked, strict=True):
        choice = answer["choices"][0]
        assert choice["decoding_steps"] == [None] and choice["acceptance_source"] == ["none"]
        assert choice["token_count_source"] == ["tokenized_text"]
        text = "".join(tokenizer.decode([t]) for t in engine.tokens(prompt, MAX_NEW))
        assert choice["new_tokens"] == [len(tokenizer(text, add_special_tokens=False).input_ids)]
    overall = summary.iloc[-1]
    assert math.isnan(overall.mean_accepted_tokens) and math.isnan(overall.accept_rate_pos1)
    assert math.isnan(overall.engine_acceptance_length) and overall.speedup > 0


def test_metrics_tolerate_unknown_steps():
    record = {"question_id": 1, "category": "qa", "choices": [{"new_tokens": [4, 6], "wall_time": [1.0, 1.0],
                                                                 "decoding_steps": [None, 2],
                                                                 "accept_lengths": [3, 2]}]}
    row = summarize("x", [record], {}, ci_samples=0).iloc[-1]
    assert math.isnan(row.mean_accepted_tokens) and row.tokens_per_s == 5.0
    assert row.accept_rate_pos1 == 1.0 and row.accept_rate_pos2 == 0.5  # the known turn's two decode steps


def test_concurrency_puts_requests_in_flight_together(compose, tokenizer, tmp_path):
    engine = FakeEngine(decode=tokenizer.decode, hold=3)  # answers none until 3 are in flight
    with ExitStack() as stack:
        spec = stack.enter_context(FakeServer(engine)).url
        summary = run(compose(*server_args("llamacpp_ngram", spec, serve(stack, tokenizer)), "server.concurrency=3",
                              "task=qa", "task.limit=3", "warmup_tokens=0"))
    assert engine.max_in_flight == 3 and len(engine.bodies) == 3
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    groups = {a["choices"][0]["group"]["id"] for a in answers}
    assert len(groups) == 1 and summary.concurrency.tolist() == [3, 3]
    group_wall = answers[0]["choices"][0]["group"]["wall_s"]  # shared by token count, as batched rows of our engine
    assert sum(a["choices"][0]["wall_time"][0] for a in answers) == pytest.approx(group_wall)
    assert all(a["choices"][0]["wall_time"][0] == pytest.approx(group_wall / 3) for a in answers)  # 12 tokens each
    # each request's clock reads lie between the group's (read before the pool starts and after it joins): nested,
    # so load cannot break it
    assert all(a["choices"][0]["latency"][0] <= group_wall for a in answers)


def test_parse_counters_reads_vllm_exposition():
    text = ('# HELP vllm:spec_decode_num_drafts_total drafts\n# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5.0\n'
            'vllm:spec_decode_num_drafts_created 1.7e9\nllamacpp:spec_decode_num_drafts_total 99\n')
    counters = parse_counters(text, "vllm:")
    assert (counters.drafts, counters.accepted, counters.per_position) == (10.0, 7.0, {0: 5.0, 1: 2.0})
    assert counters.as_dict()["acceptance_length"] == pytest.approx(1.7)
    assert parse_counters("process_cpu_seconds_total 1\n", "vllm:") is None


def launch_args(port: int, base_url: str | None) -> list[str]:
    url = f"http://127.0.0.1:{port}"
    return ["backend=server", "server=llamacpp_ngram", f"server.url={url}", f"server.baseline_url={base_url}",
            f"server.launch='{sys.executable} -m tests.fake_server --port {port} --timings'",
            "server.baseline_launch=null", "server.ready_timeout_s=120"]


def test_a_launched_server_is_polled_logged_and_stopped(compose, tokenizer, tmp_path):
    port = free_port()
    with ExitStack() as stack:
        run(compose(*launch_args(port, serve(stack, tokenizer)), "task=qa", "task.limit=1"))
    log = (tmp_path / "run" / "server.log").read_text()
    assert "-m tests.fake_server" in log and f"fake server listening on http://127.0.0.1:{port}" in log
    assert refuses(f"http://127.0.0.1:{port}")  # stopped at the end
    answer = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]
    assert answer["choices"][0]["acceptance_source"] == ["llamacpp_timings"]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["server"]["launched"] == [f"{sys.executable} -m tests.fake_server --port {port} --timings"]


def test_a_launched_server_is_stopped_after_an_error(compose):
    port, other = free_ports(2)
    missing = f"http://127.0.0.1:{other}"
    with pytest.raises(MissingArtifactError, match="server.baseline_url"):
        run(compose(*launch_args(port, missing), "task=qa", "task.limit=1"))
    assert refuses(f"http://127.0.0.1:{port}")


def test_a_launch_onto_a_port_already_answering_is_refused(compose, tokenizer, tmp_path):
    """Another run's server on the port: the launched one cannot bind it, and the run must not measure the other."""
    with ExitStack() as stack:
        busy = serve(stack, tokenizer)
        port = int(busy.rsplit(":", 1)[1])
        with pytest.raises(ConfigError, match=f"something already answers at {busy}, where server.launch"):
            run(compose(*launch_args(port, busy), "task=qa", "task.limit=1"))
    assert not (tmp_path / "run" / "server.log").exists()  # nothing was launched


def test_a_missing_server_names_its_url_and_setting(compose):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(MissingArtifactError) as err:
        run(compose(*server_args("vllm", url, url), "task=qa", "task.limit=1"))
    assert str(err.value).startswith(f"no server answers at {url}") and "server.url=<its url>" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_llama_server_says_how_to_build_it(compose, monkeypatch):
    monkeypatch.setenv("SPECBENCH_LLAMA_SERVER", "/nonexistent/llama-server")
    with pytest.raises(MissingArtifactError) as err:
        run(compose("backend=server", "server=llamacpp_ngram", "task=qa", "task.limit=1"))
    message = str(err.value)
    assert message.startswith("server program /nonexistent/llama-server not found")
    assert "pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36" in message
    assert "-DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF" in message and "SPECBENCH_LLAMA_SERVER" in message


def test_cli_exits_2_with_one_line_for_a_missing_server(tiny_checkpoint, tmp_path):
    from tests.conftest import tiny_overrides

    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "bench", *tiny_overrides(tiny_checkpoint, tmp_path / "run"),
                           *server_args("vllm", url, url), "task=qa", "task.limit=1"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: no server answers at {url}")


def test_server_configs_compose_and_need_backend_server(compose):
    from bench.errors import ConfigError

    cfg = compose("backend=server", "server=vllm", "server.concurrency=4", "out_dir=null")
    for name in ("llamacpp_ngram", "vllm", "sglang"):
        assert compose("backend=server", f"server={name}").server.health_path == "/health"
    with pytest.raises(ConfigError, match="backend=server"):
        run(compose("server=vllm"))
    with pytest.raises(ConfigError, match="needs a server config"):
        run(compose("backend=server"))
    assert cfg.server.concurrency == 4 and cfg.server.extra_body.return_token_ids is True


def test_report_and_regression_gate_read_a_server_run(compose, tokenizer, tmp_path, capsys):
    from bench.report.regress import regress
    from bench.report.render import write_report

    with ExitStack() as stack:
        spec, base_url = serve(stack, tokenizer, timings=True), serve(stack, tokenizer)
        run(compose(*server_args("llamacpp_ngram", spec, base_url), "task=qa", "task.limit=2"))
    write_report(tmp_path / "run", tmp_path / "report")
    board = pd.read_csv(tmp_path / "report" / "leaderboard.csv")
    row = board[(board.method == "llamacpp_ngram") & (board.task == "overall")].iloc[0]
    assert row.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / (MAX_NEW - 1 - sum(speculate(MAX_NEW))))
    assert row.exact_match == 1.0 and row.speedup > 0 and row.device == "server:llamacpp"
    gate = tmp_path / "baseline.json"
    assert regress(tmp_path / "run", gate, update=True) == 0
    assert regress(tmp_path / "run", gate) == 0


def test_chat_endpoint_sends_the_conversation(compose, tokenizer, tmp_path):
    engine = FakeEngine(decode=tokenizer.decode)
    with FakeServer(engine) as server:
        run(compose(*server_args("vllm", server.url, None), "server.speculative=false", "server.endpoint=chat",
                    "server.model=served-name", "task=mt_bench", "task.limit=1", "warmup_tokens=0"))
    first, second = engine.bodies
    assert first["model"] == "served-name" and first["max_tokens"] == MAX_NEW and "prompt" not in first
    answer = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]["choices"][0]
    assert second["messages"][1] == {"role": "assistant", "content": answer["turns"][0]}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert answer["token_count_source"] == ["engine", "engine"]  # vllm.yaml asks for return_token_ids
    assert answer["decoding_steps"] == [n - 1 for n in answer["new_tokens"]]  # no speculation: a token a step
