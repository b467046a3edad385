"""backend=server against a real llama.cpp `llama-server` (built by tools/build_llama_server.sh; skipped when it
is not there): the harness launches it with its n-gram speculation and, for the baseline, without; stops both; and
records answers in our layout with token ids and acceptance from llama.cpp's own counters (/metrics around each
request, checked against the response's timings)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.config import compose_config
from bench.measure.run import run
from bench.records import read_jsonl

BINARY = Path(os.environ.get("SPECBENCH_LLAMA_SERVER", "~/.cache/specbench/bin/llama-server")).expanduser()

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(not BINARY.exists(), reason=f"no llama-server at {BINARY}: "
                                                             "bash tools/build_llama_server.sh builds it")]


def test_llama_server_ngram_speculation_is_recorded_like_our_engine(tmp_path):
    cfg = compose_config("backend=server", "server=llamacpp_ngram", "task=qa", "task.limit=3",
                         "gen.max_new_tokens=128", f"out_dir={tmp_path / 'run'}")
    summary = run(cfg)
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    baseline = read_jsonl(tmp_path / "run" / "baseline.jsonl")
    assert len(answers) == len(baseline) == 3
    for answer, base in zip(answers, baseline):
        choice = answer["choices"][0]
        assert choice["token_count_source"] == ["engine"] and choice["new_tokens"] == [len(choice["token_ids"][0])]
        assert choice["token_ids"] == base["choices"][0]["token_ids"] and answer["exact_match"] is True
        assert choice["acceptance_source"] == ["llamacpp_metrics"] and choice["accepted"][0] <= choice["drafted"][0]
        assert choice["decoding_steps"][0] == choice["new_tokens"][0] - 1 - choice["accepted"][0]
        lengths = choice["accept_lengths"]
        assert len(lengths) == choice["decoding_steps"][0] and sum(lengths) == choice["new_tokens"][0] - 1
    overall = summary.set_index("task").loc["overall"]
    assert overall.exact_match == 1.0 and overall.mean_accepted_tokens > 1.0
    assert (tmp_path / "run" / "server.log").read_text().count("--spec-type ngram-simple") == 1
    assert "--spec-type" not in (tmp_path / "run" / "baseline_server.log").read_text().splitlines()[0]
