"""bfloat16 as a CPU setting: refused without bfloat16 instructions, and exactness judged by a float32 copy of the
target, so bfloat16's own noise can excuse a divergence only where float32 says the two tokens tie."""
from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

import bench.engine.loop
from bench.engine.acceptance import Acceptance
from bench.errors import ConfigError
from bench.measure.exactness import find_divergence
from bench.measure.metrics import matched_share
from bench.measure.run import run
from bench.models import check_dtype_supported, cpu_bfloat16_support
from bench.records import read_jsonl
from tests.conftest import make_tiny_model, vanilla_tokens

REPEAT = "method.name=repeat", "+method.drafter={_target_:tests.drafters.RepeatLastDrafter,width:3}"
BFLOAT16 = "model.dtype=bfloat16", "+model.tie_check_dtype=float32", "+model.allow_slow_bfloat16=true"


def test_bfloat16_support_is_read_from_the_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert cpu_bfloat16_support(cpuinfo) == ["amx_bf16", "avx512_bf16"]
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert cpu_bfloat16_support(cpuinfo) == []
    assert cpu_bfloat16_support(tmp_path / "missing") == []


def test_bfloat16_on_a_cpu_without_bfloat16_instructions_is_refused_in_one_line():
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"neither AMX-BF16 nor AVX512-BF16.*model.dtype=float32") as refused:
        check_dtype_supported(OmegaConf.create({"dtype": "bfloat16"}), cpu, support=[])
    assert "\n" not in str(refused.value)
    check_dtype_supported(OmegaConf.create({"dtype": "bfloat16"}), cpu, support=["amx_bf16"])
    check_dtype_supported(OmegaConf.create({"dtype": "bfloat16", "allow_slow_bfloat16": True}), cpu, support=[])
    check_dtype_supported(OmegaConf.create({"dtype": "float32"}), cpu, support=[])
    check_dtype_supported(OmegaConf.create({"dtype": "bfloat16"}), torch.device("cuda"), support=[])


def test_a_float32_copy_judges_a_bfloat16_divergence():
    judge = make_tiny_model(dtype=torch.float32)
    model = make_tiny_model(dtype=torch.bfloat16)
    prompt = [3, 1, 4, 1, 5]
    base = vanilla_tokens(model, prompt, 8)
    with torch.inference_mode():
        exact = judge(input_ids=torch.tensor([prompt + base[:3]])).logits[0, -1]
    ours = exact.argsort(descending=True)[:2].tolist()
    other = next(t for t in ours if t != base[3])  # a token that is not vanilla's at position 3
    turns = [{"token_ids": base[:3] + [other] + base[4:], "prompt_ids": prompt}]
    record = {"choices": [{"token_ids": [base]}]}
    distance = (exact.max() - exact[[other, base[3]]].min()).item()
    found = find_divergence(model, turns, record, tie_margin=distance * 1.01, check_model=judge)
    assert found["position"] == 3 and found["check_dtype"] == "float32" and found["numeric_tie"]
    assert found["tie_distance"] == pytest.approx(distance, abs=1e-4)
    assert found["check_gap"] == pytest.approx((exact[base[3]] - exact[other]).item(), abs=1e-4)
    assert not find_divergence(model, turns, record, tie_margin=distance * 0.99, check_model=judge)["numeric_tie"]


def trusting_accept(logits, tree):
    """A broken verifier: keeps the draft's first branch whatever the target says."""
    if tree is None or not len(tree):
        return Acceptance([0], [int(logits[0].argmax())])
    rows, row = [0], 0
    while tree.children[row]:
        row = tree.children[row][0] + 1
        rows.append(row)
    return Acceptance(rows, [tree.tokens[r - 1] for r in rows[1:]] + [int(logits[row].argmax())])


def test_a_broken_drafter_in_bfloat16_is_a_failure_not_a_tie(compose, tmp_path, monkeypatch):
    monkeypatch.setattr(bench.engine.loop, "greedy_accept", trusting_accept)
    summary = run(compose(*BFLOAT16, "model.tie_margin=0.05", *REPEAT, "task=qa", "task.limit=2"))
    answers = read_jsonl(tmp_path / "run" / "answers.jsonl")
    assert [a["exact_match"] for a in answers] == [False, False]
    for answer in answers:
        divergence = answer["divergence"]
        assert divergence["check_dtype"] == "float32" and not divergence["numeric_tie"]
        assert divergence["tie_distance"] > 0.05
    overall = summary.set_index("task").loc["overall"]
    assert overall.exact_match == 0 and overall.numeric_ties == 0 and overall.exact_until_divergence < 1
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["dtype"] == "bfloat16" and isinstance(meta["cpu_bfloat16"], list)


def test_exact_until_divergence_is_the_share_of_vanilla_tokens_before_the_first_difference():
    def record(qid, lengths, exact=True, divergence=None):
        return {"question_id": qid, "choices": [{"new_tokens": lengths}], "exact_match": exact,
                "divergence": divergence}

    baselines = {1: record(1, [4, 2]), 2: record(2, [2])}
    assert matched_share([record(1, [4, 2]), record(2, [2])], baselines) == 1.0
    # question 1 diverges at token 2 of turn 0 (its turn 1 counts nothing); question 2 matches: (2 + 2) / 8
    diverged = record(1, [4, 2], False, {"turn": 0, "position": 2})
    assert matched_share([diverged, record(2, [2])], baselines) == pytest.approx(4 / 8)
    in_second_turn = record(1, [4, 2], False, {"turn": 1, "position": 1})
    assert matched_share([in_second_turn], baselines) == pytest.approx(5 / 6)
    sampled = record(2, [2], None)
    assert math.isnan(matched_share([sampled], baselines)) and math.isnan(matched_share([record(3, [1])], baselines))
