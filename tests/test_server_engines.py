"""backend=server against fakes of TGI, LMDeploy and MLC-LLM (tests/fake_server.py, in the formats their sources
define): each engine's request, its token ids (or text) reaching the records, and #MAT and per-position acceptance
computed from what the engine reports, NaN where it reports nothing."""
from __future__ import annotations

import json
import math
from contextlib import ExitStack

import pytest

from bench.errors import ConfigError
from bench.measure.run import run
from bench.measure.serving.acceptance import SpecCounters
from bench.measure.serving.engine_counters import from_tgi_steps, parse_mlc_metrics, parse_tgi_summary
from bench.measure.serving.stream import event_tokens
from bench.records import read_jsonl
from tasks import load_questions
from tasks.prompts import build_prompt
from tests.fake_server import DRAFT_WIDTH, FakeEngine, FakeServer, speculate, tgi_metrics_text
from tests.test_server import MAX_NEW, serve, server_args, tokenizer  # noqa: F401 (tokenizer: a fixture)

ACCEPTS = speculate(MAX_NEW)  # [2, 0, 1, 2, 0, 0]: 5 accepted drafts, 6 decode steps after the prefill
STEPS = len(ACCEPTS)
BY_LENGTH = [3, 3, 2, 1, 1, 1]  # the decode steps longest first


def run_engine(compose, tokenizer, config: str, counters: str | None, *more: str) -> tuple[FakeEngine, object]:
    """Two questions of task qa against a fake speculative engine publishing `counters` and a plain baseline."""
    engine = FakeEngine(decode=tokenizer.decode, counters=counters)
    with ExitStack() as stack:
        spec = stack.enter_context(FakeServer(engine)).url
        summary = run(compose(*server_args(config, spec, serve(stack, tokenizer)), "task=qa", "task.limit=2", *more))
    return engine, summary


def prompts(compose, tokenizer) -> list[list[int]]:
    """Our rendering of the two questions' first turns, as token ids."""
    questions = load_questions(compose("task=qa", "task.limit=2").task)
    return [build_prompt(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in questions]


def asked(engine: FakeEngine, path: str, max_key: str) -> list[dict]:
    """The timed requests the engine got (the warm-up asks for fewer tokens)."""
    return [b for b in engine.bodies if b["path"] == path and b.get("parameters", b).get(max_key) == MAX_NEW]


def test_tgi_text_in_token_ids_out_and_acceptance_from_its_skipped_tokens_summary(compose, tokenizer, tmp_path):
    engine, summary = run_engine(compose, tokenizer, "tgi", "tgi")
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    bodies = asked(engine, "/generate_stream", "max_new_tokens")
    for answer, body, prompt in zip(answers, bodies, prompts(compose, tokenizer), strict=True):
        choice = answer["choices"][0]
        assert body["inputs"] == tokenizer.decode(prompt) and "stream" not in body
        assert body["parameters"] == {"max_new_tokens": MAX_NEW, "stop": [], "seed": body["parameters"]["seed"],
                                      "details": True, "do_sample": False}  # greedy: no temperature (TGI refuses 0)
        assert choice["token_ids"] == [engine.tokens([len(body["inputs"]) % engine.vocab], MAX_NEW)]
        assert choice["token_count_source"] == ["engine"]
        assert choice["turns"] == [tokenizer.decode(choice["token_ids"][0]).strip()]
        assert choice["acceptance_source"] == ["tgi_metrics"] and choice["decoding_steps"] == [STEPS]
        assert choice["accepted"] == [sum(ACCEPTS)] and choice["drafted"] == [None]
        assert choice["accept_lengths"] == []  # TGI keeps quantiles, not the steps' lengths
        assert answer["exact_match"] is True
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / STEPS)
    assert math.isnan(overall.accept_rate_pos1)
    counters = json.loads((tmp_path / "run" / "meta.json").read_text())["server"]["acceptance_counters"]
    assert counters["drafts"] == 2 * (1 + STEPS) and counters["accepted"] == 2 * sum(ACCEPTS)  # TGI counts prefills
    assert overall.engine_acceptance_length == pytest.approx(MAX_NEW / (1 + STEPS))  # 1 + skipped / TGI's steps


def test_tgi_counts_that_do_not_add_up_to_the_turn_are_not_used():
    counted = parse_tgi_summary(tgi_metrics_text(steps=7, skipped=5))
    assert (counted.drafts, counted.accepted, counted.draft_tokens, counted.per_position) == (7.0, 5.0, 0.0, {})
    assert from_tgi_steps(12, counted) == {"decode_steps": 6, "accept_lengths": [],
                                           "acceptance_source": "tgi_metrics", "drafted": None, "accepted": 5}
    assert from_tgi_steps(13, counted) is None  # another request's steps counted in
    assert from_tgi_steps(4, SpecCounters(drafts=4.0))["accept_lengths"] == [1, 1, 1]
    assert from_tgi_steps(4, None) is None
    assert parse_tgi_summary("# TYPE tgi_request_count counter\ntgi_request_count 3\n") is None  # no step yet


def test_tgi_special_tokens_keep_their_id_and_leave_the_text():
    event = {"index": 3, "token": {"id": 2, "text": "<|im_end|>", "logprob": -0.1, "special": True},
             "generated_text": "Paris", "details": {"finish_reason": "eos_token", "generated_tokens": 3}}
    assert event_tokens(event) == ("", [2])
    assert event_tokens({"token": {"id": 7, "text": " Paris", "special": False}}) == (" Paris", [7])


def test_lmdeploy_token_ids_in_and_out_and_acceptance_from_its_spec_decode_counters(compose, tokenizer, tmp_path):
    engine, summary = run_engine(compose, tokenizer, "lmdeploy", "lmdeploy:")
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    for answer, body, prompt in zip(answers, asked(engine, "/generate", "max_tokens"), prompts(compose, tokenizer),
                                    strict=True):
        choice = answer["choices"][0]
        assert body == {"path": "/generate", "input_ids": prompt, "max_tokens": MAX_NEW,
                        "temperature": 0.0, "stop": [], "stream": True}
        assert choice["token_ids"] == [engine.tokens(body["input_ids"], MAX_NEW)]
        assert choice["token_count_source"] == ["engine"] and len(choice["itl_s"][0]) == MAX_NEW - 1
        assert choice["acceptance_source"] == ["lmdeploy_metrics"] and choice["decoding_steps"] == [STEPS]
        assert choice["accept_lengths"] == BY_LENGTH and choice["drafted"] == [DRAFT_WIDTH * len(ACCEPTS)]
        assert answer["exact_match"] is True
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / STEPS)
    assert overall.accept_rate_pos1 == pytest.approx(3 / 6) and overall.accept_rate_pos2 == pytest.approx(2 / 6)
    assert overall.accept_rate_pos3 == 0.0
    assert overall.engine_acceptance_length == pytest.approx(1 + sum(ACCEPTS) / len(ACCEPTS))


def test_mlc_llm_acceptance_from_its_debug_engine_metrics(compose, tokenizer, tmp_path):
    engine, summary = run_engine(compose, tokenizer, "mlc_llm", "mlc")
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    for answer, body, prompt in zip(answers, asked(engine, "/v1/completions", "max_tokens"),
                                    prompts(compose, tokenizer), strict=True):
        choice = answer["choices"][0]
        assert body["prompt"] == prompt and "return_token_ids" not in body
        streamed = "".join(tokenizer.decode([t]) for t in engine.tokens(body["prompt"], MAX_NEW))
        assert choice["token_count_source"] == ["tokenized_text"] and choice["turns"] == [streamed.strip()]
        assert choice["token_ids"] == [tokenizer(streamed, add_special_tokens=False).input_ids]
        assert choice["new_tokens"] == [MAX_NEW]  # the fake's text tokenizes back to its 12 tokens
        assert choice["acceptance_source"] == ["mlc_llm_metrics"] and choice["decoding_steps"] == [STEPS]
        assert choice["accept_lengths"] == BY_LENGTH and choice["drafted"] == [DRAFT_WIDTH * len(ACCEPTS)]
    overall = summary.iloc[-1]
    assert overall.mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / STEPS)
    assert overall.accept_rate_pos1 == pytest.approx(3 / 6) and overall.accept_rate_pos2 == pytest.approx(2 / 6)
    counters = json.loads((tmp_path / "run" / "meta.json").read_text())["server"]["acceptance_counters"]
    assert counters == {"drafts": 12.0, "draft_tokens": 36.0, "accepted": 10.0, "acceptance_length": 1 + 10 / 12,
                        "accepted_per_position": {"0": 6.0, "1": 4.0, "2": 0.0}}


def test_mlc_llm_without_its_debug_endpoints_reports_nothing(compose, tokenizer, tmp_path, capsys):
    engine, summary = run_engine(compose, tokenizer, "mlc_llm", None)  # served without --enable-debug: 404
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert choice["acceptance_source"] == ["none"] and choice["decoding_steps"] == [None]
    overall = summary.iloc[-1]
    assert math.isnan(overall.mean_accepted_tokens) and math.isnan(overall.engine_acceptance_length)
    assert "/debug/dump_engine_metrics (HTTP Error 404: Not Found); no acceptance counters" in capsys.readouterr().err


def test_mlc_llm_engine_metrics_parse_as_counters():
    spec = {"draft_count": [4, 4, 4], "accept_count": [4, 3, 1], "accept_prob": {"accept_prob{step=0}": 1.0}}
    counted = parse_mlc_metrics(json.dumps({"metrics": {"completion_tokens_sum": 9, "spec_decode": spec}}))
    assert counted == SpecCounters(drafts=4.0, draft_tokens=8.0, accepted=4.0, per_position={0: 3.0, 1: 1.0})
    assert parse_mlc_metrics(json.dumps({"completion_tokens_sum": 9, "spec_decode": spec})) == counted
    assert parse_mlc_metrics(json.dumps({"metrics": {"completion_tokens_sum": 0}})) == SpecCounters()  # no step yet
    assert parse_mlc_metrics("<html>not found</html>") is None and parse_mlc_metrics('{"detail": "x"}') is None


@pytest.mark.parametrize("name, engine, endpoint, health", [("tgi", "tgi", "tgi", "/health"),
                                                            ("lmdeploy", "lmdeploy", "lmdeploy", "/health"),
                                                            ("mlc_llm", "mlc_llm", "completions", "/v1/models")])
def test_engine_configs_compose(compose, name, engine, endpoint, health):
    server = compose("backend=server", f"server={name}").server
    assert (server.engine, server.endpoint, server.health_path) == (engine, endpoint, health)
    assert server.url.startswith("http://127.0.0.1:") and server.baseline_url != server.url


def test_no_server_config_names_every_engine(compose):
    with pytest.raises(ConfigError, match=r"server=llamacpp_ngram \| vllm \| sglang \| tgi \| lmdeploy \| mlc_llm"):
        run(compose("backend=server"))
