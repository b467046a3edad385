"""Hydra (methods/hydra.py): sequentially dependent heads, lossless greedy decoding, checkpoints, training."""
from __future__ import annotations

import pytest
import torch

from bench.models import MissingArtifactError
from methods.heads import DraftVocabulary, save_heads
from methods.hydra import HydraDrafter, HydraHeads, load_hydra
from methods.medusa import MedusaDrafter, MedusaHeads
from methods.trees import TREES
from tests.conftest import VOCAB
from tests.drafters import recording
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2


def random_heads(seed: int = 0, num_heads: int = 4) -> HydraHeads:
    torch.manual_seed(seed)
    heads = HydraHeads(64, num_heads).double()
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return heads


Recorder = recording(HydraDrafter)


@pytest.mark.parametrize("tree_size", [3, 16, 63])
def test_greedy_hydra_equals_vanilla(tiny_model, prompts, tree_size, one_thread):
    accepted = []
    for seed, prompt in enumerate(prompts):
        drafter = Recorder(tiny_model, choices="mc_sim_7b_63", tree_size=tree_size, heads=random_heads(seed))
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
    assert 0 in accepted and max(accepted) >= 1


def test_heads_read_the_draft_tokens_above_them(tiny_model):
    """Head 1's guess changes with the depth-1 token on its path (Medusa's head 1 would not): the tree's level-2
    tokens under two different depth-1 siblings differ."""
    drafter = HydraDrafter(tiny_model, choices=[[0], [1], [0, 0], [1, 0]], heads=random_heads(1, num_heads=2))
    with torch.inference_mode():
        drafter.start([1, 2, 3], hidden=tiny_model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
                      .hidden_states[-1][0])
        tree = drafter.propose([1, 2, 3, 4], budget=10)
    assert tree.parents == [-1, -1, 0, 1] and tree.tokens[0] != tree.tokens[1]
    heads = random_heads(1, num_heads=2)
    path_a = tiny_model.get_input_embeddings()(torch.tensor([[4, tree.tokens[0]]]))
    path_b = tiny_model.get_input_embeddings()(torch.tensor([[4, tree.tokens[1]]]))
    h = drafter.hidden[None]
    vocab = DraftVocabulary(tiny_model.get_output_embeddings())
    with torch.no_grad():
        assert int(heads.logits(h, path_a, vocab, 1).argmax()) == tree.tokens[2]
        assert int(heads.logits(h, path_b, vocab, 1).argmax()) == tree.tokens[3]


def test_untrained_hydra_heads_draft_like_untrained_medusa_heads(tiny_model, prompts):
    """Both start as x + SiLU(b) on h_t (the same ResBlocks here), so their first trees agree token for token."""
    hydra_heads, medusa_heads = HydraHeads(64, 3).double(), MedusaHeads(64, 3).double()
    hydra_heads.blocks.load_state_dict(medusa_heads.blocks.state_dict())
    hydra = HydraDrafter(tiny_model, choices="mc_sim_7b_63", tree_size=10, heads=hydra_heads)
    medusa = MedusaDrafter(tiny_model, choices="mc_sim_7b_63", tree_size=10, heads=medusa_heads)
    hidden = torch.randn(4, 64, dtype=torch.float64)
    for drafter in (hydra, medusa):
        drafter.start(prompts[0], hidden=hidden)
    assert hydra.propose(prompts[0], 20).tokens == medusa.propose(prompts[0], 20).tokens


def test_checkpoint_round_trip_and_missing_checkpoint(tiny_model, tmp_path):
    heads = random_heads(2, num_heads=2)
    save_heads(tmp_path / "ck", {"specbench_method": "hydra", "num_heads": 2, "num_layers": 1},
               {**heads.state_dict(), "draft_vocab_ids": torch.arange(0, VOCAB, 2)}, {})
    loaded, vocab, _ = load_hydra(tmp_path / "ck", tiny_model)
    assert vocab.size == VOCAB // 2 and loaded.num_heads == 2
    with pytest.raises(MissingArtifactError, match="python -m bench.train method=hydra"):
        load_hydra(tmp_path / "nothing", tiny_model)


@pytest.mark.real_model
def test_committed_hydra_heads_are_lossless_on_smollm2():
    mean_accepted = assert_lossless_on_smollm2("hydra", category="writing", count=2)
    assert mean_accepted > 1.3
