"""Hydra (methods/hydra/): sequentially dependent heads, lossless greedy decoding, checkpoints, training."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModel

from bench.engine.kvcache import new_cache
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.heads.common import DraftVocabulary, save_heads
from methods.hydra.checkpoints import load_hydra
from methods.hydra.drafter import HydraDrafter
from methods.hydra.heads import HydraHeads, HydraPrefixHeads
from methods.medusa.drafter import MedusaDrafter
from methods.medusa.heads import MedusaHeads
from tests.conftest import VOCAB
from tests.drafters import recording
from tests.method_checks import assert_first_nodes_drafted_alike, assert_lossless, assert_lossless_on_smollm2


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


@pytest.mark.parametrize("tree_size", [3, 63])
def test_first_nodes_come_from_the_levels_they_need_alike(tiny_model, prompts, tree_size, one_thread):
    drafter = HydraDrafter(tiny_model, choices="mc_sim_7b_63", tree_size=tree_size, heads=random_heads(4))
    assert HydraDrafter.partial_drafts and assert_first_nodes_drafted_alike(tiny_model, drafter, prompts[0], 30) > 8


def test_heads_read_the_draft_tokens_above_them(tiny_model):
    """Head 1's guess changes with the depth-1 token on its path (Medusa's head 1 would not): the tree's level-2
    tokens under two different depth-1 siblings differ."""
    drafter = HydraDrafter(tiny_model, choices=[[0], [1], [0, 0], [1, 0]], heads=random_heads(1, num_heads=2))
    with torch.inference_mode():
        drafter.start([1, 2, 3], hidden=tiny_model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
                      .hidden_states[-1][0])
        tree = drafter.propose([1, 2, 3, 4], max_tokens=10)
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


def write_upstream_checkpoint(model, folder, num_heads: int = 2, num_layers: int = 3, seed: int = 0):
    """A tiny Hydra++ checkpoint in zankner/Hydra's layout, written from its key names alone: config.json +
    hydra_lm_head.pt holding a one-layer prefix model (token embedding included, as upstream saves it), per head a
    first block (linear + res_connection over (k + 2) x H), the repeated block stored at Sequential positions 3, 5,
    ... and a vocabulary projection with bias. Returns (state, prefix model)."""
    torch.manual_seed(seed)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = 1
    prefix = AutoModel.from_config(config).float().eval()  # stored in float32 (upstream: fp16), used in float64
    hidden, vocab = config.hidden_size, config.vocab_size
    state = {f"prefix_embeding_layer.{k}": v for k, v in prefix.state_dict().items()}

    def rand(*shape):
        return torch.randn(*shape) * 0.1

    for k in range(num_heads):
        for name in ("linear", "res_connection"):
            state[f"hydra_mlp.{k}.1.{name}.weight"] = rand(hidden, (k + 2) * hidden)
            state[f"hydra_mlp.{k}.1.{name}.bias"] = rand(hidden)
        repeated = rand(hidden, hidden), rand(hidden)
        for position in range(3, 2 * num_layers, 2):
            state[f"hydra_mlp.{k}.{position}.linear.weight"], state[f"hydra_mlp.{k}.{position}.linear.bias"] = repeated
        state[f"hydra_lm_head.{k}.1.weight"], state[f"hydra_lm_head.{k}.1.bias"] = rand(vocab, hidden) * 10, rand(vocab)
    folder.mkdir(parents=True)
    torch.save(state, folder / "hydra_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({
        "hydra_num_heads": num_heads, "hydra_num_layers": num_layers, "hydra_head_arch": "prefix-mlp",
        "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": "tiny"}))
    return {k: v.double() for k, v in state.items()}, prefix.double()


def test_hydra_plus_plus_checkpoint_computes_as_published(tiny_model, tmp_path):
    """Head k's logits from the loaded Hydra++ heads equal the published architecture written out by hand:
    prefix = one decoder layer + norm over the target's features; x = concat(prefix_t, e(root), e(x_1..x_k));
    y = res_connection(x) + SiLU(linear(x)); y <- y + SiLU(repeated(y)), num_layers - 1 times; logits = W y + b."""
    state, prefix = write_upstream_checkpoint(tiny_model, tmp_path / "hydra++")
    heads, vocab, _ = load_hydra(tmp_path / "hydra++", tiny_model)
    assert isinstance(heads, HydraPrefixHeads) and vocab.size == VOCAB
    silu = torch.nn.functional.silu
    features = torch.randn(7, 64, dtype=torch.float64)
    path = tiny_model.get_input_embeddings()(torch.tensor([5, 9]))  # root, x_1
    with torch.no_grad():
        prefix_t = prefix(inputs_embeds=features[None]).last_hidden_state[0, -1]
        x = torch.cat([prefix_t, path.flatten()])
        y = (state["hydra_mlp.1.1.res_connection.weight"] @ x + state["hydra_mlp.1.1.res_connection.bias"]
             + silu(state["hydra_mlp.1.1.linear.weight"] @ x + state["hydra_mlp.1.1.linear.bias"]))
        for _ in range(2):
            y = y + silu(state["hydra_mlp.1.3.linear.weight"] @ y + state["hydra_mlp.1.3.linear.bias"])
        expected = state["hydra_lm_head.1.1.weight"] @ y + state["hydra_lm_head.1.1.bias"]
        cache = new_cache()
        got_prefix = torch.cat([heads.prefix_features(features[:4], cache), heads.prefix_features(features[4:], cache)])
        got = heads.logits(got_prefix[-1], path, vocab, 1)
    torch.testing.assert_close(got_prefix[-1], prefix_t)
    torch.testing.assert_close(got, expected)


def test_hydra_plus_plus_is_lossless_and_its_prefix_sees_the_accepted_context(tiny_model, prompts, one_thread,
                                                                              tmp_path):
    """Greedy decoding with a loaded Hydra++ checkpoint equals vanilla; at every proposal the h_t the heads read
    equals the prefix layer run uncached over the target's features of the whole accepted context."""
    _, prefix = write_upstream_checkpoint(tiny_model, tmp_path / "hydra++", num_heads=4, num_layers=2, seed=3)
    seen = []

    class Checked(Recorder):
        def propose(self, context, max_tokens):
            seen.append((list(context), self.hidden.clone()))
            return super().propose(context, max_tokens)

    accepted = []
    for prompt in prompts:
        drafter = Checked(tiny_model, checkpoint=str(tmp_path / "hydra++"), choices="mc_sim_7b_63", tree_size=16)
        assert_lossless(tiny_model, drafter, prompt, 40)
        accepted += drafter.accepted
    assert len(seen) > 10 and 0 in accepted and max(accepted) >= 1
    with torch.no_grad():
        for context, hidden in seen[::3]:
            features = tiny_model(input_ids=torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states[-1]
            torch.testing.assert_close(hidden, prefix(inputs_embeds=features).last_hidden_state[0, -1])


def test_unsupported_hydra_architecture_is_refused(tiny_model, tmp_path):
    write_upstream_checkpoint(tiny_model, tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    (tmp_path / "ck" / "config.json").write_text(json.dumps({**config, "hydra_head_arch": "cross-attn"}))
    with pytest.raises(InvalidArtifactError, match="'cross-attn'.*not supported"):
        load_hydra(tmp_path / "ck", tiny_model)
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    (tmp_path / "ck" / "hydra_lm_head.pt").unlink()
    with pytest.raises(MissingArtifactError, match="no hydra_lm_head.pt"):
        load_hydra(tmp_path / "ck", tiny_model)


@pytest.mark.real_model
def test_committed_hydra_heads_are_lossless_on_smollm2():
    mean_accepted = assert_lossless_on_smollm2("hydra", category="writing", count=2)
    assert mean_accepted > 1.3
