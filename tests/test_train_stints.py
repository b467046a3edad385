"""Training in stints (methods/heads/training.py): bfloat16 autocast, continuing the committed head, crash-resume within
a stint, the card's stints, evaluation of a committed head without training."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from bench.artifacts import PROJECT_ROOT
from methods.heads import training
from methods.heads.settings import TrainingRun
from methods.heads.training import TRAIN_STATE, earlier_stints, train_heads, training_dtype
from tests.test_head_training import corpus, train_config, train_run  # noqa: F401 (a fixture)

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 {extra}\n"


def test_auto_dtype_is_bfloat16_only_where_the_cpu_has_bfloat16_matrix_instructions(capsys):
    cpu = torch.device("cpu")
    assert training_dtype("auto", cpu, CPUINFO.format(extra="amx_bf16 amx_tile")) == torch.bfloat16
    assert training_dtype("auto", cpu, CPUINFO.format(extra="avx512_bf16")) == torch.bfloat16
    assert capsys.readouterr().err == ""
    assert training_dtype("auto", cpu, CPUINFO.format(extra="")) == torch.float32
    assert "training in float32" in capsys.readouterr().err
    assert training_dtype("bfloat16", cpu, CPUINFO.format(extra="")) == torch.bfloat16  # forced


def test_a_bfloat16_step_runs_the_heads_in_bfloat16_and_keeps_weights_and_adam_in_float32():
    from methods.heads.common import DraftVocabulary
    from methods.heads.features import Features
    from methods.medusa.heads import MedusaHeads
    from methods.medusa.train import MedusaRecipe

    torch.manual_seed(0)
    heads, lm_head = MedusaHeads(16, 2), torch.nn.Linear(16, 50, bias=False)
    seen = []
    heads.blocks[0][0].linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    batch = Features(torch.randint(50, (2, 6)), torch.randn(2, 6, 16), torch.randint(50, (2, 6)),
                     torch.ones(2, 6, dtype=torch.bool))
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    loss = training.train_step(MedusaRecipe(), heads, DraftVocabulary(lm_head), batch, None, optimizer, 1e-2, 1.0,
                               torch.bfloat16)
    assert seen == [torch.bfloat16] and isinstance(loss, float)
    assert all(p.dtype == torch.float32 for p in heads.parameters())
    assert all(v.dtype == torch.float32 for s in optimizer.state.values() for v in s.values() if v.is_floating_point())


def heads_dir(tmp_path):
    return tmp_path / "heads"


def card_of(tmp_path) -> dict:
    return json.loads((heads_dir(tmp_path) / "card.json").read_text())


def test_stints_continue_the_committed_head_with_its_optimizer_state_or_a_warm_restart(tiny_checkpoint, corpus,
                                                                                       tmp_path, one_thread):
    from methods.medusa.train import MedusaRecipe

    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "medusa", "train.draft_vocab_size=64"), MedusaRecipe())
    first = card_of(tmp_path)
    assert [s["start"] for s in first["stints"]] == ["scratch"]
    assert first["stints"][0]["dtype"] in ("float32", "bfloat16")
    assert (heads_dir(tmp_path) / TRAIN_STATE).exists() and not (tmp_path / "resume.pt").exists()
    weights = load_file(heads_dir(tmp_path) / "model.safetensors")

    # a stint of no steps from the committed head writes the very same weights: it started from them
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "medusa", "train.resume=true", "train.max_steps=0"),
                MedusaRecipe())
    second = card_of(tmp_path)
    assert "saved float32 weights and AdamW state" in second["stints"][1]["start"]
    again = load_file(heads_dir(tmp_path) / "model.safetensors")
    assert all(torch.equal(weights[k], again[k]) for k in weights) and set(weights) == set(again)

    (heads_dir(tmp_path) / TRAIN_STATE).unlink()
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "medusa", "train.resume=true", "train.max_steps=3"),
                MedusaRecipe())
    third = card_of(tmp_path)
    assert third["stints"][2]["start"].startswith("warm restart") and third["stints"][2]["steps"] == 3
    assert third["steps"] == 4 + 0 + 3 and third["tokens_seen"] == 7 * 2 * 32
    assert third["train_minutes"] == round(sum(s["minutes"] for s in third["stints"]), 2)
    assert len(third["commands"]) == 3 and third["draft_vocab_size"] == 64  # the committed vocabulary kept
    assert third["stints"][2]["data"]["source"] == "sharegpt" and not third["stints"][2]["data"]["self_distilled"]


def test_an_interrupted_stint_continues_from_its_crash_resume_file(tiny_checkpoint, corpus, tmp_path, one_thread,
                                                                  monkeypatch):
    from methods.medusa.train import MedusaRecipe

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "write_heads", crash)
    with pytest.raises(KeyboardInterrupt):
        train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "medusa"), MedusaRecipe())
    assert (tmp_path / "resume.pt").exists() and not heads_dir(tmp_path).exists()
    monkeypatch.undo()
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "medusa", "train.max_steps=6"), MedusaRecipe())
    card = card_of(tmp_path)
    assert len(card["stints"]) == 1 and card["steps"] == 6 and len(card["stints"][0]["commands"]) == 2
    assert [e["step"] for e in card["heldout_agreement_history"]] == [2, 4, 6]


def test_minutes_zero_prints_the_committed_eagle_heads_agreement_per_depth_and_writes_nothing(tiny_checkpoint, corpus,
                                                                                             tmp_path, one_thread,
                                                                                             capsys):
    from methods.eagle.train import EagleRecipe

    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "eagle", "train.ttt_steps=2"), EagleRecipe(ttt_steps=2))
    card = card_of(tmp_path)
    assert [h["depth"] for h in card["heldout_agreement"]] == [1, 2, 3, 4]
    before = {p.name: p.stat().st_mtime_ns for p in heads_dir(tmp_path).iterdir()}
    capsys.readouterr()
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "eagle", "train.minutes=0"), EagleRecipe())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["heldout_agreement"] == card["heldout_agreement"]  # same head, same held-out set, float32
    assert {p.name: p.stat().st_mtime_ns for p in heads_dir(tmp_path).iterdir()} == before


def test_resume_without_a_committed_head_says_how_to_make_one(tiny_checkpoint, corpus, tmp_path, one_thread):
    from bench.errors import MissingArtifactError
    from methods.hydra.train import HydraRecipe

    with pytest.raises(MissingArtifactError, match="train.resume=false"):
        train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "hydra", "train.resume=true"), HydraRecipe())


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "hydra", "sps"])
def test_the_committed_cards_totals_are_the_sums_of_their_stints(method):
    card = json.loads((PROJECT_ROOT / "artifacts" / method / "smollm2_135m" / "card.json").read_text())
    stints = earlier_stints(card)
    assert stints == card["stints"] and len(stints) >= 1
    assert card["train_minutes"] == round(sum(s["minutes"] for s in stints), 2)
    assert card["steps"] == sum(s["steps"] for s in stints)
    assert card["tokens_seen"] == sum(s["tokens"] for s in stints)
    assert card["commands"] == [c for s in stints for c in s["commands"]]


def test_a_card_from_before_stints_reads_as_one_earlier_stint():
    legacy = {"commands": ["python -m bench.train method=sps"], "train_minutes": 16.03, "steps": 398,
              "recipe": {"batch_size": 4, "seq_len": 256, "autocast": "bfloat16"}, "data": "ShareGPT ...",
              "mean_accepted_tokens": {"untrained": 1.0, "trained": 1.286}}
    (stint,) = earlier_stints(legacy)
    assert stint["commands"] == legacy["commands"] and stint["minutes"] == 16.03 and stint["steps"] == 398
    assert stint["tokens"] == 398 * 4 * 256 and stint["dtype"] == "bfloat16"
    assert stint["heldout_agreement"] == legacy["mean_accepted_tokens"]


def sps_config(checkpoint, tmp_path, *overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[
            "method=sps", f"model.path={checkpoint}", "model.gguf_file=null", "model.package=null", "model.name=tiny",
            "train.layers=[0]", "train.seq_len=16", "train.batch_size=2", "train.max_steps=2", "train.eval_questions=1",
            "train.eval_tokens=4", "train.eval_draft_tokens=2", f"train.checkpoint={tmp_path / 'resume.pt'}",
            f"method.drafter.draft_path={tmp_path / 'draft'}", *overrides])


def sps_run(cfg) -> TrainingRun:
    """The checked SpS training run of `cfg` (what bench.train hands methods/sps/train.py)."""
    from methods.sps.settings import SpsTrainSettings

    return TrainingRun.from_config(cfg, SpsTrainSettings)


def test_sps_stints_continue_the_committed_draft(tiny_checkpoint, tmp_path, one_thread):
    from methods.sps.train import train

    out_dir = train(sps_run(sps_config(tiny_checkpoint, tmp_path)))
    weights = load_file(out_dir / "model.safetensors")
    train(sps_run(sps_config(tiny_checkpoint, tmp_path, "train.resume=true", "train.max_steps=0")))
    card = json.loads((out_dir / "card.json").read_text())
    assert [s["start"] for s in card["stints"]][0] == "scratch"
    assert "saved float32 weights and AdamW state" in card["stints"][1]["start"]
    again = load_file(out_dir / "model.safetensors")
    assert set(weights) == set(again) and all(torch.equal(weights[k], again[k]) for k in weights)
    assert card["steps"] == 2 and card["tokens_seen"] == 2 * 2 * 16 and len(card["commands"]) == 2
    assert card["mean_accepted_tokens"]["before"] == card["stints"][0]["heldout_agreement"]["after"]
