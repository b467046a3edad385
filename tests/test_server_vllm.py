"""vLLM as the harness launches it (conf/server/vllm_cpu_*.yaml): per-request acceptance from vLLM's response, launch
placeholders and environment, the draft or head a server loads (draft_of, standalone_draft), and divergences judged
for numeric ties by our copy of the served model (server.tie_check). Against fakes; the real vLLM is
tests/test_server_vllm_real.py's."""
from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from bench.errors import ConfigError
from bench.measure.exactness import find_divergence, judge_tie
from bench.measure.run import run
from bench.measure.serving.acceptance import fit_steps, from_vllm_request
from bench.measure.serving.launch import draft_of, fill_placeholders, launch_command, launch_environment
from bench.models import load_model
from bench.records import read_jsonl
from methods.sps.draft import load_draft, save_draft, slice_target, standalone_draft
from tests.fake_server import DRAFT_WIDTH, speculate
from tests.test_server import MAX_NEW, serve, server_args, tokenizer  # noqa: F401  (fixture)


def test_vllm_request_metrics_give_each_step_in_order(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec = serve(stack, tokenizer, counters="vllm:", request_metrics=True)
        summary = run(compose(*server_args("vllm_cpu_ngram", spec, serve(stack, tokenizer)), "task=qa",
                              "task.limit=2", "server.tie_check=false"))
    accepts = speculate(MAX_NEW)  # [2, 0, 1, 2, 0, 0]: the fake's vLLM reports the last as 1, before the cut
    for answer in read_jsonl(tmp_path / "run" / "answers.jsonl"):
        choice = answer["choices"][0]
        assert choice["acceptance_source"] == ["vllm_request_metrics"]
        assert choice["accept_lengths"] == [3, 1, 2, 3, 1, 1]  # in vLLM's order, the last step cut to the limit
        assert choice["decoding_steps"] == [len(accepts)] and choice["accepted"] == [sum(accepts)]
        assert choice["drafted"] == [DRAFT_WIDTH * len(accepts)]
    assert summary.iloc[-1].mean_accepted_tokens == pytest.approx((MAX_NEW - 1) / 6)
    assert summary.iloc[-1].accept_rate_pos1 == pytest.approx(3 / 6)


def test_vllm_cpu_requests_ask_for_the_usage_chunk(compose, tokenizer):
    from tests.fake_server import FakeEngine, FakeServer

    engine = FakeEngine(decode=tokenizer.decode, request_metrics=True)
    with FakeServer(engine) as server:
        run(compose("backend=server", "server=vllm_cpu_ngram", f"server.url={server.url}", "baseline=false",
                    "server.launch=null", "task=qa", "task.limit=1", "server.tie_check=false"))
    body = engine.bodies[-1]
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True
    assert body["model"] == "target" and isinstance(body["prompt"], list)


def test_fit_steps_cuts_the_last_step_and_adds_steps_that_drafted_nothing():
    assert fit_steps([1, 4, 4], 7) == [1, 4, 2]
    assert fit_steps([1, 2], 5) == [1, 2, 1, 1]
    assert fit_steps([1, 3], 0) == []


def test_from_vllm_request_without_per_step_order_uses_the_histogram():
    found = from_vllm_request(10, {"num_accepted_draft_tokens": 4, "acceptance_histogram": [1, 0, 2],
                                   "num_draft_tokens": 6})
    assert found == {"decode_steps": 5, "accept_lengths": [3, 3, 1, 1, 1],
                     "acceptance_source": "vllm_request_metrics", "drafted": 6, "accepted": 4}
    assert from_vllm_request(10, None) is None and from_vllm_request(10, {"mean_acceptance_length": 1.0}) is None


def test_launch_placeholders_are_filled_by_name_and_json_is_kept(compose):
    cfg = compose("backend=server", "server=vllm_cpu_ngram", "server.binary=/usr/bin/env")
    filled = launch_command(cfg, cfg.server.launch)
    assert filled.startswith("/usr/bin/env -m vllm.entrypoints.openai.api_server --model ")
    assert '\'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1}\'' \
        in filled
    assert f"--model {OmegaConf.select(cfg, 'model.path')} " in filled  # a safetensors folder: model.path itself
    assert fill_placeholders(cfg, "{cpus}") == f"0-{os.cpu_count() - 1}"
    env = launch_environment(cfg)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == f"0-{os.cpu_count() - 1}" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["PATH"] == os.environ["PATH"]


def test_vllm_suffix_gets_the_suffix_method_and_its_k(compose):
    cfg = compose("backend=server", "server=vllm_cpu_suffix", "server.binary=/usr/bin/env",
                  "server.num_speculative_tokens=12")
    assert '\'{"method": "suffix", "num_speculative_tokens": 12}\'' in launch_command(cfg, cfg.server.launch)


def test_vllm_pard_drafts_in_parallel_from_the_pard_draft(compose):
    cfg = compose("backend=server", "server=vllm_cpu_pard", "server.num_speculative_tokens=2")
    assert json.loads(cfg.server.spec_config.replace("{draft_dir}", "/d")) == {
        "method": "draft_model", "model": "/d", "num_speculative_tokens": 2, "parallel_drafting": True}
    from bench.config import compose_config

    assert draft_of(compose_config("backend=server", "server=vllm_cpu_pard")) == "artifacts/pard/smollm2_135m"


def test_vllm_dflash_drafts_a_block_from_the_draft_it_is_given(compose):
    cfg = compose("backend=server", "server=vllm_cpu_dflash", "server.num_speculative_tokens=3", "server.draft=/d")
    assert json.loads(cfg.server.spec_config.replace("{draft_dir}", "/d")) == {
        "method": "dflash", "model": "/d", "num_speculative_tokens": 3}
    from bench.config import compose_config

    assert draft_of(compose_config("backend=server", "server=vllm_cpu_dflash", "server.draft=/d")) == "/d"


def test_a_missing_vllm_environment_says_how_to_build_it(compose):
    cfg = compose("backend=server", "server=vllm_cpu_ngram", "server.binary=/nonexistent/python")
    with pytest.raises(Exception, match="bash tools/build_vllm_cpu.sh"):
        launch_command(cfg, cfg.server.launch)


def test_draft_of_names_the_folder_the_method_runs_on_this_model():
    from bench.config import compose_config

    assert draft_of(compose_config("backend=server", "server=vllm_cpu_eagle3")) == "artifacts/eagle3/smollm2_135m"
    assert draft_of(compose_config("backend=server", "server=vllm_cpu_draft")) == "artifacts/sps/smollm2_135m"
    assert draft_of(compose_config("backend=server", "server=vllm_cpu_draft", "server.draft=/x")) == "/x"
    with pytest.raises(ConfigError, match="set server.draft=<folder> or server.draft_of=<method>"):
        draft_of(compose_config("backend=server", "server=vllm_cpu_ngram"))
    with pytest.raises(ConfigError, match="method=eagle3 has no draft or head for model=vicuna_7b"):
        draft_of(compose_config("backend=server", "server=vllm_cpu_eagle3", "model=vicuna_7b"))


def test_a_standalone_draft_computes_what_the_shared_draft_does(compose, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    cfg = compose("model.dtype=float32")  # the standalone copy is float32, as vLLM loads it here
    target, _ = load_model(cfg.model, torch.device("cpu"))
    save_draft(slice_target(target, [0]), tmp_path / "draft", {"made_by": "test"})
    folder = standalone_draft(tmp_path / "draft", Path(cfg.model.path))
    assert folder.parent == tmp_path / "cache" / "models" and "specbench_shares_target_embeddings" not in json.loads(
        (folder / "config.json").read_text())
    alone = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    shared = load_draft(tmp_path / "draft", target)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    torch.testing.assert_close(alone(ids).logits, shared(ids).logits, rtol=0, atol=0)
    assert standalone_draft(tmp_path / "draft", Path(cfg.model.path)) == folder  # made once


def test_tie_check_judges_a_server_divergence_with_our_copy_of_the_model(compose, tokenizer, tmp_path,
                                                                          monkeypatch):
    import bench.measure.backends.server as server_backend

    calls = []

    def spy(model, turns, baseline, tie_margin=0.0):
        calls.append((model, turns, baseline, tie_margin))
        return find_divergence(model, turns, baseline, tie_margin)

    monkeypatch.setattr(server_backend, "find_divergence", spy)
    with ExitStack() as stack:
        spec, base_url = serve(stack, tokenizer, bend_at=3), serve(stack, tokenizer)
        cfg = compose(*server_args("vllm", spec, base_url), "task=qa", "task.limit=1", "server.tie_check=true")
        run(cfg)
    divergence = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]["divergence"]
    assert divergence["position"] == 3 and "reason" not in divergence
    assert [c[0] is None for c in calls] == [True, False] and calls[1][3] == cfg.model.tie_margin
    judge, turns, baseline, _ = calls[1]
    prefix = turns[0]["prompt_ids"] + baseline["choices"][0]["token_ids"][0][:3]
    expected = judge_tie(judge, prefix, divergence["method_token"], divergence["vanilla_token"], cfg.model.tie_margin)
    assert divergence["logit_gap"] == expected["logit_gap"] and divergence["tie_distance"] == expected["tie_distance"]
    assert divergence["numeric_tie"] is expected["numeric_tie"]
    assert str(next(judge.parameters()).dtype) == f"torch.{cfg.model.get('tie_check_dtype') or cfg.model.dtype}"


def test_without_tie_check_a_server_divergence_says_why_no_tie_is_told(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec, base_url = serve(stack, tokenizer, bend_at=3), serve(stack, tokenizer)
        run(compose(*server_args("vllm", spec, base_url), "task=qa", "task.limit=1"))
    divergence = read_jsonl(tmp_path / "run" / "answers.jsonl")[0]["divergence"]
    assert divergence["logit_gap"] is None and "no logits" in divergence["reason"]


def test_reuse_running_servers_are_not_launched_again(compose, tokenizer, tmp_path):
    with ExitStack() as stack:
        spec, base_url = serve(stack, tokenizer), serve(stack, tokenizer)
        run(compose("backend=server", "server=vllm_cpu_ngram", f"server.url={spec}", f"server.baseline_url={base_url}",
                    "server.binary=/nonexistent/python", "server.reuse_running=true", "server.tie_check=false",
                    "task=qa", "task.limit=1"))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["server"]["launched"] == [] and meta["server"]["launch"].startswith("{binary} -m vllm")
    assert not (tmp_path / "run" / "server.log").exists()
