"""Medusa (methods/medusa/): the tree from choices, lossless greedy decoding, checkpoint formats, training."""
from __future__ import annotations

import json

import pytest
import torch

from bench.errors import MissingArtifactError
from methods.heads.common import DraftVocabulary, save_heads
from methods.heads.trees import TREES, tree_from_choices
from methods.medusa.checkpoints import load_medusa
from methods.medusa.drafter import MedusaDrafter
from methods.medusa.heads import MedusaHeads
from tests.conftest import VOCAB
from tests.drafters import recording
from tests.method_checks import assert_first_nodes_drafted_alike, assert_lossless, assert_lossless_on_smollm2

MC_SIM_7B_63 = TREES["mc_sim_7b_63"]


def random_heads(hidden_size: int, num_heads: int = 4, seed: int = 0, private_vocab_size: int | None = None):
    """Heads with small random weights: their guesses are sometimes right, mostly wrong."""
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden_size, num_heads, 1, private_vocab_size).double()
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return heads


Recorder = recording(MedusaDrafter)


def test_tree_from_choices_orders_nodes_and_links_parents():
    template, heads, ranks = tree_from_choices([[1], [0, 0], [0], [0, 1], [0, 0, 0]])
    assert template.parents == [-1, -1, 0, 0, 2]  # [0], [1], [0,0], [0,1], [0,0,0]
    assert heads.tolist() == [0, 0, 1, 1, 2] and ranks.tolist() == [0, 1, 0, 1, 0]
    for size in (1, 5, 16, 63):  # every prefix of mc_sim_7b_63 is a valid tree
        assert len(tree_from_choices(MC_SIM_7B_63[:size])[0]) == size
    with pytest.raises(ValueError, match=r"no parent \[2\]"):
        tree_from_choices([[0], [2, 0]])


@pytest.mark.parametrize("tree_size", [4, 16, 63])
@pytest.mark.parametrize("vocab_slice", [None, 48])
def test_greedy_medusa_equals_vanilla(tiny_model, prompts, tree_size, vocab_slice, one_thread):
    lm_head = tiny_model.get_output_embeddings()
    vocab = DraftVocabulary(lm_head, None if vocab_slice is None else torch.arange(0, VOCAB, VOCAB // vocab_slice))
    accepted = []
    for seed, prompt in enumerate(prompts):
        drafter = Recorder(tiny_model, choices=MC_SIM_7B_63, tree_size=tree_size, heads=random_heads(64, seed=seed),
                           vocab=vocab)
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
    assert 0 in accepted and max(accepted) >= 1  # wrong trees and partly right ones both occurred
    if tree_size == 63 and vocab_slice is None:
        assert max(accepted) >= 2


@pytest.mark.parametrize("tree_size", [4, 63])
def test_first_nodes_come_from_the_heads_they_need_alike(tiny_model, prompts, tree_size, one_thread):
    drafter = MedusaDrafter(tiny_model, choices=MC_SIM_7B_63, tree_size=tree_size, heads=random_heads(64, seed=3))
    assert MedusaDrafter.partial_drafts and assert_first_nodes_drafted_alike(tiny_model, drafter, prompts[0], 30) > 8


def test_drafter_uses_the_feature_of_the_last_accepted_token(tiny_model, prompts, one_thread):
    """Heads that copy the target's own LM head make head 0 guess the token after the root from the root's
    predecessor's feature: its guess is the root again, so a step accepts nothing unless the target repeats."""
    heads = MedusaHeads(64, 2).double()  # untrained ResBlocks are the identity
    drafter = Recorder(tiny_model, choices=[[0], [0, 0]], heads=heads)
    out = assert_lossless(tiny_model, drafter, prompts[2], 30)
    repeats = sum(a == b for a, b in zip(out.tokens, out.tokens[1:]))
    assert sum(drafter.accepted) <= repeats


def write_upstream_checkpoint(folder, heads: MedusaHeads) -> None:
    """FasterDecoding's layout: config.json + medusa_lm_head.pt with keys `{head}.{layer}.linear.*` and
    `{head}.1.weight`."""
    folder.mkdir()
    state = {}
    for k, (block, projection) in enumerate(zip(heads.blocks, heads.projections)):
        state[f"{k}.0.linear.weight"] = block[0].linear.weight.detach().float()
        state[f"{k}.0.linear.bias"] = block[0].linear.bias.detach().float()
        state[f"{k}.1.weight"] = projection.weight.detach().float()
    torch.save(state, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads.num_heads, "medusa_num_layers": 1,
                                                    "base_model_name_or_path": "tiny"}))


def test_upstream_checkpoint_loads_with_private_projections(tiny_model, prompts, tmp_path, one_thread):
    heads = random_heads(64, num_heads=3, private_vocab_size=VOCAB)
    write_upstream_checkpoint(tmp_path / "medusa-tiny", heads)
    loaded, vocab, _ = load_medusa(tmp_path / "medusa-tiny", tiny_model)
    x = torch.randn(5, 64, dtype=torch.float64)
    for k in range(3):
        block = heads.blocks[k][0].linear
        expected = (x + torch.nn.functional.silu(block(x))) @ heads.projections[k].weight.T
        torch.testing.assert_close(loaded.logits(x, vocab, k), expected.detach(), rtol=1e-5, atol=1e-5)
    drafter = Recorder(tiny_model, checkpoint=str(tmp_path / "medusa-tiny"), choices=MC_SIM_7B_63[:20])
    assert_lossless(tiny_model, drafter, prompts[1], 30)


def test_own_checkpoint_round_trip_keeps_the_vocabulary_slice(tiny_model, tmp_path):
    heads = random_heads(64, num_heads=2)
    ids = torch.tensor([0, 3, 7, 50, 95])
    save_heads(tmp_path / "ck", {"specbench_method": "medusa", "num_heads": 2, "num_layers": 1},
               {**heads.state_dict(), "draft_vocab_ids": ids}, {"method": "medusa"})
    loaded, vocab, fingerprint = load_medusa(tmp_path / "ck", tiny_model)
    assert vocab.token_ids.tolist() == ids.tolist() and vocab.size == 5 and len(fingerprint) == 16
    x = torch.randn(3, 64, dtype=torch.float64)
    full = heads.logits(x, DraftVocabulary(tiny_model.get_output_embeddings()), 1)
    torch.testing.assert_close(loaded.logits(x, vocab, 1), full[:, ids].detach(), rtol=2e-3, atol=2e-3)  # fp16 stored


def test_missing_checkpoint_names_the_training_command(tiny_model, tmp_path):
    with pytest.raises(MissingArtifactError, match="python -m bench.train method=medusa"):
        load_medusa(tmp_path / "nothing-here", tiny_model)


def test_tree_deeper_than_the_heads_is_refused(tiny_model):
    with pytest.raises(ValueError, match="3 deep but the checkpoint has 2 heads"):
        MedusaDrafter(tiny_model, choices=[[0], [0, 0], [0, 0, 0]], heads=random_heads(64, num_heads=2))


@pytest.mark.real_model
def test_committed_medusa_heads_are_lossless_on_smollm2():
    mean_accepted = assert_lossless_on_smollm2("medusa", category="writing", count=2)
    assert mean_accepted > 1.2  # untrained heads accept almost nothing (~1.0)
