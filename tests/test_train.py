"""methods/sps/train.py: the ShareGPT reader, the distillation loss and the learning-rate schedule."""
from __future__ import annotations

import json

import torch
from omegaconf import OmegaConf

from methods.sps import train


def test_sharegpt_reader_maps_roles_and_stops_at_a_truncated_record(tmp_path):
    records = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": []},
        {"id": "c", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "2+2?"},
                                      {"from": "unknown", "value": "x"}]},
    ]
    text = json.dumps(records, indent=1)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.rindex('"conversations"')] + '"conv')  # the wheel's file is cut mid-record too
    assert list(train.sharegpt_conversations(path)) == [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    ]
    path.write_text(text)
    assert list(train.sharegpt_conversations(path))[1] == [{"role": "system", "content": "be brief"},
                                                           {"role": "user", "content": "2+2?"}]


def test_kl_loss_is_the_mean_per_position_kl_from_target_to_draft():
    generator = torch.Generator().manual_seed(0)
    target, draft = torch.randn(2, 3, 7, generator=generator), torch.randn(2, 3, 7, generator=generator)
    p, q = target.softmax(-1), draft.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    torch.testing.assert_close(train.kl_loss(draft, target), expected)
    assert train.kl_loss(target, target).abs() < 1e-6


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    cfg = OmegaConf.create({"lr": 1.0, "warmup_steps": 4})
    assert [train.learning_rate(cfg, step, 0.0) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert train.learning_rate(cfg, 10, 0.0) == 1.0
    assert abs(train.learning_rate(cfg, 10, 0.5) - 0.55) < 1e-9
    assert abs(train.learning_rate(cfg, 10, 1.0) - 0.1) < 1e-9
    assert abs(train.learning_rate(cfg, 10, 3.0) - 0.1) < 1e-9
