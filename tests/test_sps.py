"""SpS (methods/sps/): lossless greedy decoding, a draft KV cache kept in sync, adaptive γ, draft artifacts."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from bench.artifacts import PROJECT_ROOT
from bench.engine.loop import SpeculativeEngine, StopCondition
from bench.errors import MissingArtifactError
from bench.planning.costmodel import Profile
from bench.planning.policy import PlannedDrafter
from methods.sps.draft import load_draft, resolve_draft_path, save_draft, slice_target
from methods.sps.drafter import DraftModelDrafter
from tests.conftest import make_tiny_model
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, compose_method


@pytest.fixture(scope="module")
def drafts(tiny_model):
    """A perfect draft (the target itself), a one-layer slice of it, and an unrelated random model."""
    return {"self": tiny_model, "slice": slice_target(tiny_model, [0]), "other": make_tiny_model(seed=1)}


class Recorder(DraftModelDrafter):
    """Records (γ when proposing, chain length, drafts accepted) for every step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int, int, int]] = []

    def propose(self, context, max_tokens):
        self._gamma = self.num_draft_tokens
        return super().propose(context, max_tokens)

    def update(self, step):
        super().update(step)
        self.log.append((self._gamma, len(step.tree) if step.tree else 0, step.acceptance.num_accepted_drafts))


@pytest.mark.parametrize("draft", ["self", "slice", "other"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_sps_equals_vanilla(tiny_model, prompts, drafts, draft, adaptive, one_thread):
    for prompt in prompts:
        drafter = Recorder(tiny_model, draft_model=drafts[draft], num_draft_tokens=3, adaptive=adaptive)
        out = assert_lossless(tiny_model, drafter, prompt, 30)
        if draft == "self":  # every draft is right: only max_tokens bounds the chain
            assert all(accepted == length for _, length, accepted in drafter.log)
            assert out.decode_steps < 30 / 3


def test_greedy_sps_with_sliding_window(windowed_model, prompts, one_thread):
    """Target and draft (a one-layer slice) with sliding-window attention, prompts longer than the window."""
    drafter = Recorder(windowed_model, draft_model=slice_target(windowed_model, [0]), num_draft_tokens=3)
    for prompt in prompts:
        assert_lossless(windowed_model, drafter, prompt, 30)
    assert max(accepted for _, _, accepted in drafter.log) > 0


def test_draft_cache_holds_exactly_the_accepted_context(tiny_model, prompts, drafts, one_thread):
    """After a turn the draft's KV cache equals a fresh prefill of the context it claims to hold."""
    prompt = prompts[2]
    for draft in drafts.values():
        drafter = DraftModelDrafter(tiny_model, draft_model=draft, num_draft_tokens=4, adaptive=True)
        tokens = SpeculativeEngine(tiny_model, drafter).generate(prompt, StopCondition(25)).tokens
        held = drafter.network.length
        assert len(prompt) + len(tokens) - 6 <= held <= len(prompt) + len(tokens) - 1
        fresh = DynamicCache(config=draft.config)
        with torch.no_grad():
            draft(input_ids=torch.tensor([(prompt + tokens)[:held]]), cache=fresh)
        for got, want in zip(drafter.network.cache.layers, fresh.layers):
            torch.testing.assert_close(got.keys, want.keys)
            torch.testing.assert_close(got.values, want.values)


def test_sizing_auto_prices_each_chain_length_by_its_own_drafting(tiny_model, prompts, drafts, one_thread):
    """SpS drafts only the k tokens a step asks for, so method.sizing=auto prices drafting per length: on a clock
    that ticks once per draft forward, each length asked costs at most that many ticks, and several lengths were
    asked."""
    forwards = [0]
    draft = slice_target(tiny_model, [0])
    draft.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    verify = Profile({}, [1, 2, 4, 8], [16], [[0.001, 0.001, 0.0012, 0.01]])
    auto = PlannedDrafter(DraftModelDrafter(tiny_model, draft_model=draft, num_draft_tokens=6, adaptive=False),
                          verify, tiny_model.device, prior=(1000.0, 1000.0), clock=lambda: 1e-4 * forwards[0])
    for prompt in prompts:
        assert_lossless(tiny_model, auto, prompt, 30)
    measured = auto.planner.size_draft_seconds
    assert len(measured) > 1 and all(mean <= 1e-4 * size + 1e-12 for size, (mean, _) in measured.items())
    assert auto.planner.drafting_seconds() != [auto.planner.draft_seconds] * (auto.planner.full_size + 1)


def test_adaptive_gamma_follows_the_transformers_heuristic(tiny_model, prompts, drafts, one_thread):
    """γ + 2 after a fully accepted chain, else max(1, γ - 1); back to the initial γ on every new turn."""
    for draft, trend in (("self", "up"), ("other", "down")):
        drafter = Recorder(tiny_model, draft_model=drafts[draft], num_draft_tokens=3, adaptive=True)
        engine = SpeculativeEngine(tiny_model, drafter)
        for prompt in prompts[:2]:
            drafter.log.clear()
            engine.generate(prompt, StopCondition(40))
            gammas = [gamma for gamma, _, _ in drafter.log]
            assert gammas[0] == 3
            for (gamma, length, accepted), following in zip(drafter.log, gammas[1:]):
                assert following == (gamma + 2 if accepted == length else max(1, gamma - 1))
            assert max(gammas) >= 7 if trend == "up" else min(gammas) == 1
    fixed = Recorder(tiny_model, draft_model=drafts["other"], num_draft_tokens=3, adaptive=False)
    SpeculativeEngine(tiny_model, fixed).generate(prompts[0], StopCondition(20))
    assert {gamma for gamma, _, _ in fixed.log} == {3}


def test_saved_draft_stores_only_its_own_layers_and_reloads(tiny_model, tmp_path):
    draft = slice_target(tiny_model, [1])
    save_draft(draft, tmp_path / "draft", {"note": "test"})
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "draft" / "model.safetensors")
    assert not any("embed" in name or "lm_head" in name for name in stored)
    assert {t.dtype for t in stored.values()} == {torch.float16}
    loaded = load_draft(tmp_path / "draft", tiny_model)
    assert loaded.get_input_embeddings() is tiny_model.get_input_embeddings()
    assert loaded.get_output_embeddings() is tiny_model.get_output_embeddings()
    assert loaded.dtype == tiny_model.dtype and loaded.config.num_hidden_layers == 1
    for name, value in stored.items():
        torch.testing.assert_close(loaded.state_dict()[name], value.to(tiny_model.dtype))
    torch.testing.assert_close(stored["model.layers.0.mlp.up_proj.weight"],
                               tiny_model.model.layers[1].mlp.up_proj.weight.half())


def test_missing_draft_names_its_path_and_how_to_make_it(tiny_model):
    with pytest.raises(MissingArtifactError) as error:
        DraftModelDrafter(tiny_model, draft_path="artifacts/sps/nowhere",
                          train_command="python -m bench.train method=sps")
    message = str(error.value)
    assert "\n" not in message and str(PROJECT_ROOT / "artifacts/sps/nowhere") in message
    assert "python -m bench.train method=sps" in message
    assert resolve_draft_path("artifacts/sps/smollm2_135m") == PROJECT_ROOT / "artifacts/sps/smollm2_135m"
    assert resolve_draft_path("double7/vicuna-68m") is None  # a hub id


@pytest.mark.parametrize("model", ["smollm2_135m", "vicuna_7b"])
def test_config_points_the_drafter_at_the_model_draft(model):
    cfg = compose_method("sps", f"model={model}")
    assert cfg.method.drafter._target_ == "methods.sps.drafter.DraftModelDrafter"
    assert cfg.method.drafter.draft_path == {"smollm2_135m": "artifacts/sps/smollm2_135m",
                                             "vicuna_7b": "double7/vicuna-68m"}[model]
    if model == "smollm2_135m":
        assert (resolve_draft_path(cfg.method.drafter.draft_path) / "model.safetensors").exists()


@pytest.mark.real_model
def test_committed_draft_is_lossless_on_smollm2():
    """SpS with the committed trained draft equals vanilla on 2 MT-bench questions, 64 tokens each."""
    mat = assert_lossless_on_smollm2(
        lambda model, tokenizer: DraftModelDrafter(model, tokenizer, draft_path="artifacts/sps/smollm2_135m"),
        category="writing", count=2, max_new_tokens=64)
    assert mat > 1.1  # the draft is actually accepted, not just harmless (measured 1.17 on these 2 questions)


def test_artifact_fingerprint_changes_when_the_draft_is_retrained(tmp_path):
    from bench.artifacts import artifact_fingerprint

    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "card.json").write_text('{"steps": 1}')
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    first = artifact_fingerprint(folder)
    assert artifact_fingerprint(folder) == first
    (folder / "card.json").write_text('{"steps": 2}')  # retrained
    assert artifact_fingerprint(folder) != first
    assert artifact_fingerprint("double7/vicuna-68m") == "double7/vicuna-68m"  # a hub id stands for itself
