"""End-to-end tier on the real SmolLM2-135M (marked real_model)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from bench.config import compose_config
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.measure.run import run
from bench.models import eos_token_ids
from tests.conftest import spec_bench_prompts

pytestmark = pytest.mark.real_model


def test_vanilla_equals_transformers_generate(smollm2):
    model, tokenizer = smollm2
    eos = eos_token_ids(model, tokenizer)
    engine = SpeculativeEngine(model)
    for prompt in spec_bench_prompts(tokenizer, "qa", 2):
        ours = engine.generate(prompt, StopCondition(32, frozenset(eos))).tokens
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
        assert ours == theirs[0, len(prompt):].tolist()


def test_cli_run_writes_the_three_files(tmp_path):
    run(compose_config("method=vanilla", "task=qa", "task.limit=2", "gen.max_new_tokens=32", f"out_dir={tmp_path}",
                       "device=cpu"))
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [a["category"] for a in answers] == ["qa", "qa"]
    assert all(0 < a["choices"][0]["new_tokens"][0] <= 32 and a["choices"][0]["turns"][0] for a in answers)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary.task.tolist() == ["qa", "overall"] and (summary.tokens_per_s > 0).all()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["dtype"] == "float32" and meta["config"]["model"]["name"] == "smollm2_135m"
