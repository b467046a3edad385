"""The shared trained-head pipeline: feature cache (methods/heads/features.py) and training loop
(methods/heads/training.py)."""
from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from bench.artifacts import PROJECT_ROOT
from bench.models import load_model
from methods.heads.features import build_feature_cache, load_features, render_with_assistant_mask, sharegpt_sequences
from methods.heads.settings import FeatureSettings, TrainingRun

REPLY = ("Speculative decoding drafts several tokens cheaply and verifies them in one forward of the target model, "
         "so that the output is exactly what the target alone would write, only sooner. ")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A ShareGPT-format file: a few conversations, long enough for several 32-token blocks each."""
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i}: why is it faster?"},
                                                 {"from": "gpt", "value": REPLY * (1 + i % 3)}]} for i in range(12)]
    path = tmp_path_factory.mktemp("corpus") / "sharegpt.json"
    path.write_text(json.dumps(records))
    return path


def train_config(checkpoint, corpus, tmp_path, method: str, *overrides: str):
    """conf/train.yaml for `method` on the tiny checkpoint and corpus, with small budgets, writing under tmp_path."""
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[
            f"method={method}", f"model.path={checkpoint}", "model.gguf_file=null", "model.package=null",
            "model.name=tiny", f"features.corpus={corpus}", "features.seq_len=32", "features.num_sequences=8",
            "features.shard_sequences=2", f"features.dir={tmp_path / 'features'}", "train.max_steps=4",
            "train.eval_every=2", "train.batch_size=2", f"train.checkpoint={tmp_path / 'resume.pt'}",
            f"method.drafter.checkpoint={tmp_path / 'heads'}", *overrides])


def train_run(checkpoint, corpus, tmp_path, method: str, *overrides: str) -> TrainingRun:
    """The checked training run of train_config's settings (what bench.train hands the trainer)."""
    return TrainingRun.from_config(train_config(checkpoint, corpus, tmp_path, method, *overrides))


def build_cache(target, tokenizer, cfg, soft_top_k: int = 0):
    """The feature cache of `cfg`'s settings made (or completed) from ShareGPT's sequences; its folder."""
    settings = FeatureSettings.from_config(cfg)
    return build_feature_cache(target, sharegpt_sequences(tokenizer, settings), settings, soft_top_k=soft_top_k)


def test_assistant_mask_covers_exactly_the_assistant_turns(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    ids, mask = render_with_assistant_mask(tokenizer, [{"role": "user", "content": "Hi there"},
                                                       {"role": "assistant", "content": "Hello you"}])
    assert len(ids) == len(mask)
    masked = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    unmasked = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert masked == "<|im_start|>assistant\nHello you<|im_end|>\n"
    assert unmasked == "<|im_start|>user\nHi there<|im_end|>\n"


def test_feature_cache_holds_the_targets_features_and_argmax_and_resumes(tiny_checkpoint, corpus, tmp_path, one_thread):
    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "medusa")
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    folder = build_cache(target, tokenizer, cfg)
    assert sorted(p.name for p in folder.glob("shard-*.pt")) == [f"shard-0000{i}.pt" for i in range(4)]
    train_set, heldout = load_features(FeatureSettings.from_config(cfg))
    assert len(train_set) == 6 and len(heldout) == 2 and train_set.hidden.dtype == torch.bfloat16
    assert json.loads((folder / "meta.json").read_text())["settings"]["dtype"] == "bfloat16"
    with torch.inference_mode():
        out = target(input_ids=heldout.input_ids, output_hidden_states=True)
    assert torch.equal(heldout.labels, out.logits.argmax(-1))
    torch.testing.assert_close(heldout.hidden.float(), out.hidden_states[-1], atol=2e-2, rtol=1e-2)  # bfloat16
    assert heldout.mask.any() and not heldout.mask.all()

    (folder / "shard-00003.pt").unlink()  # an interrupted build: the rerun makes only what is missing
    before = (folder / "shard-00000.pt").stat().st_mtime_ns
    build_cache(target, tokenizer, cfg)
    assert (folder / "shard-00003.pt").exists() and (folder / "shard-00000.pt").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="other settings"):
        build_cache(target, tokenizer, train_config(tiny_checkpoint, corpus, tmp_path, "medusa",
                                                            "features.max_blocks_per_conversation=1"))


def test_soft_targets_are_added_to_an_existing_cache_by_one_forward_over_its_ids(tiny_checkpoint, corpus, tmp_path,
                                                                                one_thread):
    """soft_top_k > 0: per shard the target's top-k next tokens and log-probabilities (softK-*.pt), made for a cache
    that lacks them without touching its shards, and made with the shards when a cache is new."""
    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "medusa")
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    folder = build_cache(target, tokenizer, cfg)
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.pt")}
    assert load_features(FeatureSettings.from_config(cfg))[1].soft_ids is None
    build_cache(target, tokenizer, cfg, soft_top_k=5)
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.pt")} == stamps
    assert sorted(p.name for p in folder.glob("soft5-*.pt")) == [f"soft5-0000{i}.pt" for i in range(4)]
    train_set, heldout = load_features(FeatureSettings.from_config(cfg), soft_top_k=5)
    assert train_set.soft_ids.shape == (6, 32, 5) and heldout.soft_logprobs.dtype == torch.float32
    with torch.inference_mode():
        logprobs = target(input_ids=heldout.input_ids).logits.log_softmax(-1)
    best = logprobs.topk(5, dim=-1)
    assert torch.equal(heldout.soft_ids, best.indices) and torch.equal(heldout.soft_ids[..., 0], heldout.labels)
    torch.testing.assert_close(heldout.soft_logprobs, best.values)

    (folder / "shard-00003.pt").unlink()
    (folder / "soft5-00003.pt").unlink()
    build_cache(target, tokenizer, cfg, soft_top_k=5)  # a new shard is made with its soft targets
    assert torch.equal(load_features(FeatureSettings.from_config(cfg), soft_top_k=5)[0].soft_ids, train_set.soft_ids)


def test_a_float16_cache_of_before_the_dtype_knob_is_read_and_never_mixed_with_bfloat16(tiny_checkpoint, corpus,
                                                                                         tmp_path, one_thread):
    from bench.errors import ConfigError

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "medusa", "features.dtype=float16")
    target, tokenizer = load_model(cfg.model, torch.device("cpu"))
    folder = build_cache(target, tokenizer, cfg)
    meta = json.loads((folder / "meta.json").read_text())
    for key in ("dtype", "source"):  # as a cache made before these settings existed
        del meta["settings"][key]
    (folder / "meta.json").write_text(json.dumps(meta))
    build_cache(target, tokenizer, cfg)  # read as the float16 cache it is
    assert load_features(FeatureSettings.from_config(cfg))[1].hidden.dtype == torch.float16
    with pytest.raises(ConfigError, match=r"other settings \(dtype: float16 there\)"):
        build_cache(target, tokenizer, train_config(tiny_checkpoint, corpus, tmp_path, "medusa",
                                                            "features.dtype=bfloat16"))
    from omegaconf import OmegaConf

    default = OmegaConf.to_container(OmegaConf.load(PROJECT_ROOT / "conf" / "train.yaml").features)["dir"]
    assert default.endswith("-${features.source}-${features.dtype}")  # the default folder says source and dtype


def test_train_medusa_writes_a_loadable_checkpoint_and_card(tiny_checkpoint, corpus, tmp_path, one_thread):
    from methods.heads.training import train_heads
    from methods.medusa.drafter import MedusaDrafter
    from methods.medusa.train import MedusaRecipe
    from tests.method_checks import assert_lossless

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "medusa", "train.draft_vocab_size=64")
    out_dir = train_heads(TrainingRun.from_config(cfg), MedusaRecipe())
    card = json.loads((out_dir / "card.json").read_text())
    assert card["steps"] == 4 and card["tokens_seen"] == 4 * 2 * 32 and card["draft_vocab_size"] == 64
    assert [h["head"] for h in card["heldout_agreement"]] == [0, 1, 2, 3]
    assert all(0 <= h["top1"] <= h["top5"] <= 1 for h in card["heldout_agreement"])
    assert [e["step"] for e in card["heldout_agreement_history"]] == [2, 4]
    assert card["commands"] and 0 < card["heldout_vocab_coverage"] <= 1

    cfg.model.dtype = "float64"  # rules out rounding flips in the lossless check
    target, _ = load_model(cfg.model, torch.device("cpu"))
    drafter = MedusaDrafter(target, checkpoint=str(out_dir), choices=[[0], [1], [0, 0], [0, 0, 0]])
    assert drafter.vocab.size == 64
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)


def test_train_eagle_writes_a_loadable_checkpoint_and_card(tiny_checkpoint, corpus, tmp_path, one_thread):
    from methods.eagle.dynamic import Eagle2Drafter
    from methods.eagle.train import EagleRecipe
    from methods.heads.training import train_heads
    from tests.method_checks import assert_lossless

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "eagle", "train.draft_vocab_size=null")
    out_dir = train_heads(TrainingRun.from_config(cfg), EagleRecipe())
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "eagle" and card["steps"] == 4 and card["draft_vocab_size"] == 400  # full vocabulary
    assert [h["head"] for h in card["heldout_agreement"]] == [0, 1, 2, 3]  # depths of the unrolled draft
    assert all(0 <= h["top1"] <= h["top5"] <= 1 for h in card["heldout_agreement"])
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    drafter = Eagle2Drafter(target, checkpoint=str(out_dir), total_token=6, depth=3, top_k=2)
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)


def test_train_hydra_writes_a_loadable_checkpoint(tiny_checkpoint, corpus, tmp_path, one_thread):
    from methods.heads.training import train_heads
    from methods.hydra.drafter import HydraDrafter
    from methods.hydra.train import HydraRecipe
    from tests.method_checks import assert_lossless

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "hydra", "train.num_heads=3")
    out_dir = train_heads(TrainingRun.from_config(cfg), HydraRecipe())
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "hydra" and [h["head"] for h in card["heldout_agreement"]] == [0, 1, 2]
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    assert_lossless(target, HydraDrafter(target, checkpoint=str(out_dir), choices="mc_sim_7b_63", tree_size=12),
                    [5, 6, 7, 8, 9, 10], 20)
