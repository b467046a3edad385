"""EAGLE-3's trainer (methods/eagle3/train.py Eagle3Recipe through methods/heads/training.py): its loss is the drafting
computation's, training lowers it, and `train_heads` writes SafeAILab's layout that load_eagle3 loads strictly and
that drafts losslessly."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from transformers import DynamicCache

from bench.errors import ConfigError
from bench.models import load_model
from methods.eagle3.checkpoints import load_eagle3
from methods.eagle3.drafter import Eagle3Drafter
from methods.eagle3.head import Eagle3Vocabulary, eagle3_feature_layers
from methods.eagle3.train import Eagle3Recipe
from methods.heads.features import Features, load_features, soft_targets
from methods.heads.settings import TrainingRun
from methods.heads.training import train_heads, train_step
from tests.conftest import VOCAB, make_tiny_model
from tests.method_checks import assert_lossless
from tests.test_head_training import corpus, train_config, train_run  # noqa: F401 (corpus: the fixture)

SEQ, DRAFT_VOCAB = 12, 48


@pytest.fixture(scope="module")
def target():
    return make_tiny_model(seed=3, dtype=torch.float32)


def fresh_head(target, recipe: Eagle3Recipe, draft_ids: torch.Tensor):
    torch.manual_seed(0)
    head = recipe.build(target, OmegaConf.create({"draft_vocab_size": len(draft_ids), "out_dir": "unused"}))
    recipe.set_vocabulary(head, draft_ids)
    return head


@torch.no_grad()
def target_batch(target, rows: int = 2, seed: int = 1) -> Features:
    """Random sequences with the target's fused features (the cache's layout) and its argmax; every position kept."""
    ids = torch.randint(VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))
    out = target(input_ids=ids, output_hidden_states=True)
    layers = eagle3_feature_layers(target.config.num_hidden_layers)
    hidden = torch.cat([out.hidden_states[i] for i in layers], dim=-1)
    return Features(ids, hidden, out.logits.argmax(-1), torch.ones(rows, SEQ, dtype=torch.bool))


def test_the_loss_is_cross_entropy_over_the_draft_vocabulary_of_what_drafting_computes(target):
    """Step 0: (token t+1, fused feature f_t) -> the target's argmax at t+1; step 1 at t: (token t+2, the head's
    step-0 output at t) fed after the prefix 0..t as the drafter feeds a tree level. Positions whose target token is
    outside the draft vocabulary are skipped; the steps weigh 1 and 0.8."""
    batch = target_batch(target, rows=1)
    labels = batch.labels[0]
    draft_ids = torch.cat([labels[2:7], torch.arange(VOCAB)]).unique()[:DRAFT_VOCAB].sort().values
    recipe = Eagle3Recipe(ttt_steps=2)
    head = fresh_head(target, recipe, draft_ids).eval()
    embed = target.get_input_embeddings()
    in_vocab = torch.isin(labels, draft_ids)
    assert not in_vocab.all() and in_vocab[1:].any()  # some positions are skipped, some kept
    loss, outputs = recipe.loss(head, None, batch, target)
    with torch.no_grad():
        step0 = head(embed(batch.input_ids[:, 1:]), batch.hidden[:, :-1])[0]  # [S-1, h]
        losses = []
        for step, rows in ((0, range(SEQ - 1)), (1, range(SEQ - 2))):
            logits, wanted = [], []
            for t in rows:
                if step == 0:
                    out = step0[t]
                else:  # the prefix's cache, then one tree row at position t+1
                    cache = DynamicCache()
                    head(embed(batch.input_ids[:, 1 : t + 2]), batch.hidden[:, : t + 1], cache=cache)
                    out = head(embed(batch.input_ids[:, t + 2 : t + 3]), step0[t][None, None], cache=cache,
                               position_ids=torch.tensor([[t + 1]]))[0, 0]
                if in_vocab[t + step + 1]:
                    logits.append(head.logits(out))
                    wanted.append(int(torch.searchsorted(draft_ids, labels[t + step + 1])))
            losses.append(torch.nn.functional.cross_entropy(torch.stack(logits), torch.tensor(wanted)))
            vocab_targets = outputs[step][1]
            assert vocab_targets[vocab_targets >= 0].tolist() == wanted
            torch.testing.assert_close(outputs[step][0][vocab_targets >= 0], torch.stack(logits), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, losses[0] + 0.8 * losses[1], atol=1e-5, rtol=1e-5)


def with_soft_targets(batch: Features, target, top_k: int) -> Features:
    """The batch with the target's top_k next tokens and log-probabilities, as the cache stores them."""
    with torch.no_grad():
        soft = soft_targets(target(input_ids=batch.input_ids).logits, top_k)
    return Features(batch.input_ids, batch.hidden, batch.labels, batch.mask, **soft)


def test_soft_targets_over_the_whole_vocabulary_give_upstreams_loss(target):
    """With every token's log-probability stored, step 0's loss is SafeAILab's: -sum_j p_j log q_j with p the
    target's softmax over the draft vocabulary (its logits at t2d), averaged over the positions whose target argmax
    lies in the draft vocabulary."""
    batch = target_batch(target, rows=2)
    draft_ids = torch.arange(0, VOCAB, 3)
    recipe = Eagle3Recipe(ttt_steps=1, soft_top_k=VOCAB)
    head = fresh_head(target, recipe, draft_ids).eval()
    loss, _ = recipe.loss(head, None, with_soft_targets(batch, target, VOCAB), target)
    with torch.no_grad():
        target_logits = target(input_ids=batch.input_ids).logits[:, 1:]  # at t+1: the target's next token after it
        drafted = head(target.get_input_embeddings()(batch.input_ids[:, 1:]), batch.hidden[:, :-1])  # [2, S-1, h]
        logq = head.logits(drafted).log_softmax(-1)
        p = target_logits[..., head.t2d].softmax(-1)
        kept = head.t2d[target_logits.argmax(-1)]
    assert 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(loss, -(p * logq).sum(-1)[kept].mean(), atol=1e-5, rtol=1e-5)


def test_the_full_softmax_target_is_recomputed_from_the_last_fused_layer_and_gives_upstreams_loss(target):
    """target_distribution=full: no cached soft targets; p is the target's softmax over the draft vocabulary, from
    its last layers run on the cached input of layer L-3, and the loss equals the one over exactly stored
    log-probabilities of the whole vocabulary, at every unrolled step."""
    batch = target_batch(target, rows=2, seed=5)
    draft_ids = torch.arange(0, VOCAB, 3)
    full, stored = Eagle3Recipe(ttt_steps=3, target_distribution="full"), Eagle3Recipe(ttt_steps=3, soft_top_k=VOCAB)
    head = fresh_head(target, full, draft_ids)
    assert full.soft_top_k == 0  # the cache needs no soft targets
    full_loss, _ = full.loss(head, None, batch, target)
    stored_loss, _ = stored.loss(head, None, with_soft_targets(batch, target, VOCAB), target)
    torch.testing.assert_close(full_loss, stored_loss, atol=1e-5, rtol=1e-5)
    hard_loss, _ = Eagle3Recipe(ttt_steps=3, target_distribution="argmax").loss(head, None, batch, target)
    assert abs((full_loss - hard_loss).item()) > 1e-3
    with pytest.raises(ConfigError, match="target_distribution=top64: must be one of full, top_k, argmax"):
        Eagle3Recipe(target_distribution="top64")


def test_soft_targets_of_one_token_are_the_argmax_loss_at_every_unrolled_step(target):
    """top-1 soft targets are one-hot on the argmax: the loss equals the hard-label loss, all steps shifted alike."""
    batch = target_batch(target, rows=2, seed=4)
    draft_ids = torch.arange(0, VOCAB, 2)
    hard, soft = Eagle3Recipe(ttt_steps=3), Eagle3Recipe(ttt_steps=3, soft_top_k=1)
    head = fresh_head(target, hard, draft_ids)
    hard_loss, _ = hard.loss(head, None, batch, target)
    soft_loss, _ = soft.loss(head, None, with_soft_targets(batch, target, 1), target)
    torch.testing.assert_close(soft_loss, hard_loss, atol=1e-6, rtol=1e-6)
    wider, _ = Eagle3Recipe(ttt_steps=3, soft_top_k=8).loss(head, None, with_soft_targets(batch, target, 8), target)
    assert abs((wider - hard_loss).item()) > 1e-3  # more of the distribution: another loss


def test_training_steps_lower_the_loss_on_a_fixed_batch(target):
    batch = target_batch(target, rows=4, seed=2)
    recipe = Eagle3Recipe(ttt_steps=3)
    draft_ids = torch.arange(0, VOCAB, 2)
    head = fresh_head(target, recipe, draft_ids)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    vocab = Eagle3Vocabulary(head)
    losses = [train_step(recipe, head, vocab, batch, target, optimizer, 3e-3, 0.5, torch.float32) for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0], losses
    assert torch.equal(head.d2t + torch.arange(len(draft_ids)), draft_ids)  # the maps are buffers, never trained


def test_train_eagle3_writes_safeailabs_layout_that_loads_strictly_and_drafts_losslessly(tiny_checkpoint, corpus,
                                                                                        tmp_path, one_thread, capsys):
    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "eagle3", "train.draft_vocab_size=64")
    run = TrainingRun.from_config(cfg)
    out_dir = train_heads(run, Eagle3Recipe(soft_top_k=8))
    folder = tmp_path / "features-layers_1_1_1"  # eagle3_feature_layers of a 2-layer target, not features.layers
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["settings"]["layers"] == [1, 1, 1] and not (tmp_path / "features").exists()
    assert sorted(p.name for p in folder.glob("soft8-*.pt")) == [f"soft8-0000{i}.pt" for i in range(4)]
    config = json.loads((out_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 64 and config["vocab_size"] == 400
    with safe_open(str(out_dir / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight"} <= keys
    assert not keys & {"draft_vocab_ids", "embed_tokens.weight"}
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "eagle3" and card["steps"] == 4 and card["draft_vocab_size"] == 64
    assert card["data"]["soft_targets"].startswith("the target's top-8 next tokens")
    assert [h["depth"] for h in card["heldout_agreement"]] == [1, 2, 3, 4, 5, 6, 7]  # ttt_steps 7 unrolled
    assert all(0 <= h["top1"] <= h["top5"] <= 1 for h in card["heldout_agreement"])

    cfg.model.dtype = "float64"  # rules out rounding flips in the lossless check
    model, _ = load_model(cfg.model, torch.device("cpu"))
    head, _ = load_eagle3(out_dir, model)  # strict: raises on any missing or unexpected key
    train_set, _ = load_features(replace(run.features, layers=eagle3_feature_layers(2)))
    labels = train_set.labels[train_set.mask]
    draft_ids = head.d2t + torch.arange(64)
    assert head.t2d.sum() == 64 and head.t2d[draft_ids].all()
    assert torch.bincount(labels).argmax() in draft_ids  # the training set's most frequent prediction is in
    assert_lossless(model, Eagle3Drafter(model, checkpoint=str(out_dir), total_token=8, depth=3, top_k=2),
                    [5, 6, 7, 8, 9, 10], 20)



def test_eagle3_stints_print_and_continue_the_committed_head(tiny_checkpoint, corpus, tmp_path, one_thread, capsys):
    """train.minutes=0 evaluates the committed head; train.resume=true continues it with its AdamW state (the
    vocabulary maps included in the weights it matches)."""
    settings = ("train.draft_vocab_size=64", "train.ttt_steps=2")
    out_dir = train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "eagle3", *settings), Eagle3Recipe(2))
    card = json.loads((out_dir / "card.json").read_text())
    capsys.readouterr()
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "eagle3", *settings, "train.minutes=0"),
                Eagle3Recipe(2))
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["heldout_agreement"] == card["heldout_agreement"]  # same head, same held-out set, float32
    assert printed["feature_cache"].endswith("features-layers_1_1_1")
    train_heads(train_run(tiny_checkpoint, corpus, tmp_path, "eagle3", *settings, "train.resume=true",
                             "train.max_steps=2"), Eagle3Recipe(2))
    card = json.loads((out_dir / "card.json").read_text())
    assert [s["steps"] for s in card["stints"]] == [4, 2] and card["draft_vocab_size"] == 64
    assert card["stints"][1]["start"].startswith("continued from the committed head with its saved float32 weights")
