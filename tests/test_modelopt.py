"""NVIDIA ModelOpt's Medusa (methods/medusa/modelopt.py, optional extra `.[modelopt]`; CI installs it): convert, train
the heads with the base frozen, mto.save / mto.restore, and our MedusaDrafter driving the restored heads."""
from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from omegaconf import OmegaConf

from bench.errors import MissingArtifactError
from bench.models import load_model
from methods.heads.common import DraftVocabulary
from methods.heads.features import Features
from methods.medusa.checkpoints import load_medusa
from methods.medusa.drafter import MedusaDrafter
from methods.medusa.modelopt import (
    SAVED_FILE,
    ModelOptMedusaRecipe,
    import_modelopt,
    load_modelopt_medusa,
    medusa_config,
)
from tests.conftest import VOCAB, make_tiny_model
from tests.method_checks import assert_lossless
from tests.test_head_training import corpus, train_config  # noqa: F401 (corpus: a fixture)
from tests.test_medusa import MC_SIM_7B_63


@pytest.fixture(scope="module")
def modelopt():
    """(mtsp, mto), or the module's tests skipped where the extra is not installed."""
    pytest.importorskip("modelopt.torch.speculative")
    return import_modelopt()


def converted(target, modelopt, num_heads: int = 3):
    """A deepcopy of `target` converted to Medusa by ModelOpt, with random (non-identity) heads."""
    mtsp, _ = modelopt
    model = mtsp.convert(copy.deepcopy(target), medusa_config(num_heads, 1))
    torch.manual_seed(1)
    for p in model.medusa_heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return model


def head_logits(model, hidden: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [head(hidden) for head in model.medusa_heads]


def test_missing_modelopt_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt.torch.opt", None)  # import fails as if not installed
    with pytest.raises(MissingArtifactError, match=r'pip install -e "\.\[modelopt\]"'):
        import_modelopt()


def test_round_trip_train_save_restore_and_lossless_drafting(modelopt, tiny_model, prompts, tmp_path, one_thread):
    """Convert, two training steps with the base frozen (ModelOpt's own forward), mto.save, restore: the same head
    logits, and the restored heads drive our drafter losslessly. The caller's target stays as it was."""
    _, mto = modelopt
    model = converted(tiny_model, modelopt)
    base = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("medusa_heads.")}
    heads_before = copy.deepcopy(model.medusa_heads.state_dict())
    optimizer = torch.optim.AdamW(model.medusa_heads.parameters(), lr=1e-2)  # convert leaves the base trainable
    ids = torch.tensor([prompts[2][:32]])
    for _ in range(2):
        loss = model(input_ids=ids, labels=ids.roll(-1, 1), freeze_base_model=True).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in base.items())
    assert not all(torch.equal(v, model.medusa_heads.state_dict()[k]) for k, v in heads_before.items())

    mto.save(model, tmp_path / SAVED_FILE)
    hidden = torch.randn(7, 64, dtype=torch.float64)
    expected = head_logits(model, hidden)
    restored = mto.restore(make_tiny_model(seed=5), tmp_path / SAVED_FILE)  # other base weights: all overwritten
    assert all(torch.equal(v, restored.state_dict()[k]) for k, v in model.state_dict().items())
    heads, vocab, _ = load_medusa(tmp_path, tiny_model)
    assert heads.num_heads == 3 and vocab.size == VOCAB
    for k in range(3):
        torch.testing.assert_close(heads.logits(hidden, vocab, k), expected[k], rtol=0, atol=0)
    assert type(tiny_model).__name__ == "LlamaForCausalLM" and not hasattr(tiny_model, "medusa_heads")

    for checkpoint in (tmp_path, tmp_path / SAVED_FILE):  # the folder, or the file mto.save wrote
        drafter = MedusaDrafter(tiny_model, checkpoint=str(checkpoint), choices=MC_SIM_7B_63[:20])
        assert_lossless(tiny_model, drafter, prompts[1], 30)


def test_hugging_face_checkpointing_folder_loads(modelopt, tiny_model, tmp_path):
    """ModelOpt's save_pretrained route (what enable_huggingface_checkpointing's patch writes: the model folder plus
    modelopt_state.pth), written here without patching transformers for the whole test session."""
    _, mto = modelopt
    model = converted(tiny_model, modelopt, num_heads=2)
    model.save_pretrained(tmp_path / "hf")
    torch.save(mto.modelopt_state(model), tmp_path / "hf" / "modelopt_state.pth")
    heads, vocab = load_modelopt_medusa(tmp_path / "hf", tiny_model)
    hidden = torch.randn(4, 64, dtype=torch.float64)
    for k, expected in enumerate(head_logits(model, hidden)):
        torch.testing.assert_close(heads.logits(hidden, vocab, k), expected, rtol=0, atol=0)
    assert load_medusa(tmp_path / "hf", tiny_model)[0].num_heads == 2


def test_recipe_loss_is_modelopts_frozen_base_loss(modelopt, tiny_model):
    """On the target's own features and next tokens, the recipe's loss equals ModelOpt's forward with
    freeze_base_model=True, and it trains the converted model's own head parameters."""
    recipe = ModelOptMedusaRecipe()
    view = recipe.build(copy.deepcopy(tiny_model), OmegaConf.create({"num_heads": 3, "num_layers": 1}))
    assert {id(p) for p in view.parameters()} == {id(p) for p in recipe.model.medusa_heads.parameters()}
    torch.manual_seed(2)
    for p in view.parameters():
        torch.nn.init.normal_(p, std=0.05)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = tiny_model(input_ids=ids, output_hidden_states=True)
    labels, mask = out.logits.argmax(-1), torch.rand(2, 24, generator=torch.Generator().manual_seed(4)) > 0.3
    ours, _ = recipe.loss(view, DraftVocabulary(tiny_model.get_output_embeddings()),
                          Features(ids, out.hidden_states[-1], labels, mask), tiny_model)
    theirs = recipe.model(input_ids=ids, labels=labels.masked_fill(~mask, -100), freeze_base_model=True).loss
    torch.testing.assert_close(ours, theirs)


def test_train_command_with_the_modelopt_backend(modelopt, tiny_checkpoint, corpus, tmp_path, one_thread):  # noqa: F811
    from bench.train import train as main

    out_dir = tmp_path / "medusa-modelopt"
    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "medusa", "train.backend=modelopt", "train.max_steps=2",
                       f"train.modelopt.out_dir={out_dir}", f"train.modelopt.checkpoint={tmp_path / 'mo-resume.pt'}")
    main(cfg)
    assert sorted(p.name for p in out_dir.iterdir()) == ["card.json", SAVED_FILE]
    assert not (tmp_path / "heads").exists() and not (tmp_path / "resume.pt").exists()  # the native ones untouched
    card = json.loads((out_dir / "card.json").read_text())
    assert card["backend"] == "modelopt" and card["steps"] == 2 and card["draft_vocab_size"] > 64
    assert card["commands"] and card["train_minutes"] >= 0 and card["data"]["train_sequences"] == 6
    assert len(card["heldout_agreement"]) == 4

    target, _ = load_model(OmegaConf.merge(cfg.model, {"dtype": "float64"}), torch.device("cpu"))
    drafter = MedusaDrafter(target, checkpoint=str(out_dir), choices=[[0], [1], [0, 0], [0, 0, 0]])
    assert drafter.heads.num_heads == 4 and drafter.heads.projections is not None
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)
