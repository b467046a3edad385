"""DFlash (methods/dflash/): a published-layout drafter drafts the block the paper's equations give, strict loading,
lossless greedy decoding, training."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig

from bench.engine.acceptance import Acceptance
from bench.engine.drafter import StepResult
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.dflash.checkpoints import load_dflash
from methods.dflash.drafter import DFlashDrafter
from methods.dflash.head import upstream_target_layer_ids
from methods.dflash.train import block_attention_mask, sample_anchors
from tests.conftest import VOCAB
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2
from tests.test_checkpoints import assert_one_line_refusal
from tests.test_head_training import corpus, train_config  # noqa: F401 (corpus: a fixture)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 48  # the tiny target's widths; the drafter's own MLP width
LAYER_IDS, MASK, BLOCK, THETA, EPS = [0, 1], 7, 5, 10000.0, 1e-6
PROMPT = [5, 17, 3, 40, 9, 12, 30, 2]


def random_module(target, seed: int = 0):
    """A random one-layer drafter module for `target` (block 4, its two layers' features; tests/test_batched.py)."""
    from methods.dflash.checkpoints import drafter_config, published_config
    from methods.dflash.head import DFlashDrafter as DFlashModule
    from methods.heads.tiny import random_weights

    config = published_config(target.config, 1, [0, 1], block_size=4, mask_token_id=MASK)
    return random_weights(DFlashModule(*drafter_config(config)), seed=seed).to(target.dtype)


def published_tensors(layers: int, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 weights named as a DFlashDraftModel's state dict names them."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, mean=0.0):
        return mean + torch.randn(*shape, generator=generator) * 0.3

    tensors = {"fc.weight": normal(HIDDEN, len(LAYER_IDS) * HIDDEN), "hidden_norm.weight": normal(HIDDEN, mean=1.0),
               "norm.weight": normal(HIDDEN, mean=1.0)}
    for i in range(layers):
        prefix = f"layers.{i}."
        tensors |= {prefix + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
                    prefix + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
                    prefix + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
                    prefix + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
                    prefix + "self_attn.q_norm.weight": normal(HEAD_DIM, mean=1.0),
                    prefix + "self_attn.k_norm.weight": normal(HEAD_DIM, mean=1.0),
                    prefix + "mlp.gate_proj.weight": normal(INTER, HIDDEN),
                    prefix + "mlp.up_proj.weight": normal(INTER, HIDDEN),
                    prefix + "mlp.down_proj.weight": normal(HIDDEN, INTER),
                    prefix + "input_layernorm.weight": normal(HIDDEN, mean=1.0),
                    prefix + "post_attention_layernorm.weight": normal(HIDDEN, mean=1.0)}
    return tensors


def write_published(folder, layers: int = 2, seed: int = 0, tensors: dict | None = None, **config) -> dict:
    """A z-lab-layout folder (config.json of a DFlashDraftModel, model.safetensors) for the tiny target."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = published_tensors(layers, seed) if tensors is None else tensors
    save_file(tensors, folder / "model.safetensors")
    fields = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "head_dim": HEAD_DIM, "hidden_act": "silu", "rms_norm_eps": EPS, "rope_theta": THETA,
              "num_hidden_layers": layers, "vocab_size": VOCAB, "max_position_embeddings": 512,
              "block_size": BLOCK, "num_target_layers": 2, "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
              "dflash_config": {"mask_token_id": MASK, "target_layer_ids": LAYER_IDS}}
    (folder / "config.json").write_text(json.dumps({**fields, **config}))
    return tensors


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * weight


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half pairs i, i + d/2 at angle p / theta^(2i/d)) of x [T, heads, d]."""
    half = x.shape[-1] // 2
    angle = positions[:, None].double() / THETA ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def reference_block(tensors: dict, layers: int, features: torch.Tensor, embedded: torch.Tensor,
                    start: int) -> torch.Tensor:
    """The paper's drafter written out (arXiv 2602.06036 section 3): c = hidden_norm(fc f) over the context
    positions 0 .. C-1; the block x = embedded [Q, h] at positions start .. start+Q-1; per layer u = rms(x),
    q = q_norm(W_q u), k = k_norm(W_k [c; u]), v = W_v [c; u], rotary positions, full (non-causal) attention of the
    block over [c; u] with grouped key / value heads, x += W_o a, x += down(silu(gate rms(x)) * up rms(x)); returns
    norm(x) [Q, h]."""
    t = {k: v.double() for k, v in tensors.items()}
    context = rms(features.double() @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = embedded.double()
    span = torch.arange(context.shape[0] + x.shape[0])
    for i in range(layers):
        w = {k.removeprefix(f"layers.{i}."): v for k, v in t.items() if k.startswith(f"layers.{i}.")}
        u = rms(x, w["input_layernorm.weight"])
        both = torch.cat([context, u])
        q = rope(rms((u @ w["self_attn.q_proj.weight"].T).view(-1, HEADS, HEAD_DIM), w["self_attn.q_norm.weight"]),
                 span[-x.shape[0]:])
        k = rope(rms((both @ w["self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM),
                     w["self_attn.k_norm.weight"]), span)
        v = (both @ w["self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        group = HEADS // KV_HEADS
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HEAD_DIM)
        attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(x.shape[0], -1)
        x = x + attended @ w["self_attn.o_proj.weight"].T
        h = rms(x, w["post_attention_layernorm.weight"])
        gate, up = h @ w["mlp.gate_proj.weight"].T, h @ w["mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w["mlp.down_proj.weight"].T
    return rms(x, t["norm.weight"])


def prompt_features(model, prompt: list[int]) -> tuple[torch.Tensor, int]:
    """(the target's features of the prompt at LAYER_IDS' outputs [P, 2h], its greedy next token)."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    features = torch.cat([out.hidden_states[layer + 1][0] for layer in LAYER_IDS], dim=-1)
    return features, int(out.logits[0, -1].argmax())


@pytest.mark.parametrize("layers", [1, 2])
def test_published_checkpoint_drafts_the_block_the_equations_give(tiny_model, tmp_path, layers):
    tensors = write_published(tmp_path / "zlab", layers=layers)
    drafter = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"))
    assert (drafter.block_size, drafter.feature_layers, drafter.module.mask_token_id) == (BLOCK, (1, 2), MASK)
    features, root = prompt_features(tiny_model, PROMPT)
    drafter.start(PROMPT, hidden=features)
    tree = drafter.propose(PROMPT + [root], 100)
    embedded = tiny_model.get_input_embeddings().weight[[root] + [MASK] * (BLOCK - 1)]
    expected = reference_block(tensors, layers, features, embedded, len(PROMPT))
    with torch.inference_mode():
        ours = drafter.module(embedded[None], torch.arange(len(PROMPT), len(PROMPT) + BLOCK)[None],
                              drafter.context)[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)  # float32 weights in a float64 target
    lm_head = tiny_model.get_output_embeddings().weight.double()
    assert tree.tokens == (expected[1:] @ lm_head.T).argmax(-1).tolist()
    assert tree.parents == list(range(-1, BLOCK - 2)) and tree.draft_probs is None  # a greedy chain


def test_embedding_scale_logit_multiplier_and_softcap_shape_the_sampled_rows(tiny_model, tmp_path):
    """The dflash package's optional fields: the block's embedding x input_embedding_scale, the logits
    x output_multiplier then soft-capped; each drafted row's q is softmax of those logits (temperature 1)."""
    from bench.engine.sampling import SamplingConfig

    tensors = write_published(tmp_path / "zlab", layers=1, dflash_config={
        "mask_token_id": MASK, "target_layer_ids": LAYER_IDS, "input_embedding_scale": 0.5, "output_multiplier": 2.0,
        "final_logit_softcapping": 3.0})
    drafter = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"), sampling=SamplingConfig(temperature=1.0),
                            seed=0)
    features, root = prompt_features(tiny_model, PROMPT)
    drafter.start(PROMPT, hidden=features, seed=1)
    tree = drafter.propose(PROMPT + [root], 100)
    embedded = tiny_model.get_input_embeddings().weight[[root] + [MASK] * (BLOCK - 1)] * 0.5
    logits = reference_block(tensors, 1, features, embedded, len(PROMPT))[1:] @ tiny_model.lm_head.weight.T * 2.0
    expected = (torch.tanh(logits / 3.0) * 3.0).softmax(-1)
    torch.testing.assert_close(tree.draft_probs.double(), expected, rtol=1e-4, atol=1e-5)
    assert all(expected[i, token] > 0 for i, token in enumerate(tree.tokens))


def test_context_fed_step_by_step_equals_the_whole_context(tiny_model, tmp_path):
    """The drafter's context keys after a verified step (the root's and accepted rows' features appended) are those
    of a drafter started on the longer prompt: the next block is the same."""
    write_published(tmp_path / "zlab")
    longer = PROMPT + [21, 22, 23]
    features, root = prompt_features(tiny_model, longer)
    stepwise = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"))
    stepwise.start(PROMPT, hidden=features[: len(PROMPT)])
    stepwise.propose(PROMPT + [21], 100)
    rows = features[len(PROMPT) - 1:]  # a step verifying a 3-node chain: row 0 is the root (position P)
    step_hidden = torch.cat([features[len(PROMPT):], torch.zeros(2, features.shape[1], dtype=features.dtype)])
    stepwise.update(StepResult(None, torch.zeros(5, VOCAB), Acceptance([0, 1, 2], [22, 23, root]), step_hidden))
    whole = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"))
    whole.start(longer, hidden=features)
    assert rows.shape[0] == 4 and stepwise.propose(longer + [root], 100) == whole.propose(longer + [root], 100)
    torch.testing.assert_close(stepwise.context[1][0], whole.context[1][0])


@pytest.mark.parametrize("config, fragments", [
    ({"hidden_size": HIDDEN * 2}, [f"hidden size {HIDDEN * 2}", f"this target has {HIDDEN} and {VOCAB}"]),
    ({"vocab_size": VOCAB + 1}, [f"vocabulary {VOCAB + 1}, this target has"]),
    ({"num_target_layers": 36}, ["a target of 36 layers, this one has 2"]),
    ({"architectures": ["DFlash2DraftModel"]}, ["not a DFlashDraftModel", "DFlash2's"]),
    ({"dflash_config": {"target_layer_ids": [0, 5]}}, ["lacks dflash_config.mask_token_id"]),
    ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 5]}}, ["target_layer_ids [0, 5] outside"]),
    ({"use_sliding_window": True}, ["sliding-window drafter layers"]),
])
def test_published_config_that_does_not_fit_is_refused_in_one_line(tiny_model, tmp_path, config, fragments):
    assert_one_line_refusal(refusal(tiny_model, tmp_path / "zlab", **config), *fragments)


def refusal(target, folder, **written):
    """The loader's error on a published folder written with `written` (write_published's arguments)."""
    write_published(folder, **written)
    with pytest.raises(InvalidArtifactError) as error:
        load_dflash(folder, target)
    return error


def test_published_weights_with_a_missing_or_unexpected_key_are_refused(tiny_model, tmp_path):
    tensors = published_tensors(2, 0)
    del tensors["layers.1.self_attn.k_norm.weight"]
    tensors["layers.2.mlp.up_proj.weight"] = torch.zeros(INTER, HIDDEN)
    error = refusal(tiny_model, tmp_path / "zlab", tensors=tensors)
    assert_one_line_refusal(error, "model.safetensors does not fit", "1 key missing (layers.1.self_attn.k_norm.weight)",
                            "1 key unexpected (layers.2.mlp.up_proj.weight)")


def test_missing_checkpoint_says_how_to_make_one(tiny_model, tmp_path):
    with pytest.raises(MissingArtifactError) as error:
        load_dflash(tmp_path / "none", tiny_model)
    assert_one_line_refusal(error, "python -m bench.train method=dflash")


def test_upstream_layer_rule_and_knobs(tiny_model, tmp_path):
    """The dflash package's default target layers (SmolLM2: 30 layers), block_size checked and cut to the step."""
    assert upstream_target_layer_ids(30, 1) == [15] and upstream_target_layer_ids(30, 3) == [1, 14, 27]
    assert upstream_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab's Qwen3-8B drafter's
    write_published(tmp_path / "zlab")
    with pytest.raises(ValueError, match="method.drafter.block_size=1"):
        DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"), block_size=1)
    drafter = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / "zlab"), block_size=3)
    features, root = prompt_features(tiny_model, PROMPT)
    drafter.start(PROMPT, hidden=features)
    assert len(drafter.propose(PROMPT + [root], 100)) == 2  # block 3: 2 drafts
    assert drafter.propose(PROMPT + [root], 2).tokens.__len__() == 1 and drafter.propose(PROMPT + [root], 1) is None


@pytest.mark.parametrize("block_size", [None, 2, 8])
def test_greedy_dflash_equals_vanilla(tiny_model, prompts, tmp_path, block_size, one_thread):
    for seed, prompt in enumerate(prompts):
        write_published(tmp_path / f"zlab{seed}", seed=seed)
        drafter = DFlashDrafter(tiny_model, checkpoint=str(tmp_path / f"zlab{seed}"), block_size=block_size)
        assert_lossless(tiny_model, drafter, prompt, 40)


def test_anchors_and_the_training_mask_see_what_inference_sees():
    mask = torch.tensor([[False, False, True, True, True, False], [False, True, False, False, False, False]])
    anchors, real = sample_anchors(mask, 3, torch.Generator().manual_seed(0))
    assert anchors[0].tolist() == [2, 3, 4] and real[0].tolist() == [True, True, True]
    assert real[1].tolist().count(True) == 1 and 1 in anchors[1][real[1]].tolist()  # position 0 never anchors
    allowed = block_attention_mask(torch.tensor([[2, 4]]), torch.tensor([[True, False]]), 6, 2)[0, 0]
    assert allowed.shape == (4, 10)
    assert allowed[0].tolist() == [True, True, False, False, False, False, True, True, False, False]  # before 2
    assert allowed[3].tolist() == [False] * 6 + [False, False, True, True]  # an unreal block: itself only


def test_train_dflash_writes_a_loadable_published_layout_checkpoint(tiny_checkpoint, corpus, tmp_path, one_thread):
    from bench.models import load_model
    from methods.dflash.train import DFlashRecipe
    from methods.heads.settings import TrainingRun
    from methods.heads.training import train_heads

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "dflash", "train.target_layer_ids=[0,1]",
                       "train.mask_token_id=3", "train.block_size=4", "train.draft_vocab_size=64",
                       "train.recipe.anchors_per_sequence=4")
    out_dir = train_heads(TrainingRun.from_config(cfg), DFlashRecipe([0, 1], anchors_per_sequence=4))
    card = json.loads((out_dir / "card.json").read_text())
    assert card["method"] == "dflash" and [h["depth"] for h in card["heldout_agreement"]] == [1, 2, 3]
    config = json.loads((out_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    assert config["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [0, 1]}
    cfg.model.dtype = "float64"
    target, _ = load_model(cfg.model, torch.device("cpu"))
    drafter = DFlashDrafter(target, checkpoint=str(out_dir))
    assert (drafter.block_size, drafter.vocab.size, drafter.feature_layers) == (4, 64, (1, 2))
    assert_lossless(target, drafter, [5, 6, 7, 8, 9, 10], 20)


def qa_answers(compose, tmp_path, *overrides: str) -> list[dict]:
    """The answers of `python -m bench task=qa task.limit=2 <overrides>` on the tiny checkpoint."""
    from bench.measure.run import run
    from bench.records import read_jsonl

    run(compose("task=qa", "task.limit=2", *overrides))
    return read_jsonl(tmp_path / "run" / "answers.jsonl")


@pytest.mark.parametrize("batch_size", [1, 2])
def test_runs_with_a_published_checkpoint_and_sizing_auto_are_lossless(compose, tiny_checkpoint, tmp_path,
                                                                      batch_size, one_thread):
    """`python -m bench method=dflash method.sizing=auto` on a z-lab-layout checkpoint for the tiny target, at batch 1
    and batched: every answer equals vanilla's."""
    config = AutoConfig.from_pretrained(tiny_checkpoint)
    assert (config.hidden_size, config.num_hidden_layers) == (HIDDEN, 2)
    write_published(tmp_path / "zlab", vocab_size=config.vocab_size)
    answers = qa_answers(compose, tmp_path, "method=dflash", f"method.drafter.checkpoint={tmp_path / 'zlab'}",
                         "method.sizing=auto", f"gen.batch_size={batch_size}")
    assert [(a["method"], a["exact_match"]) for a in answers] == [("dflash+auto", True)] * 2


def test_the_published_pair_for_gpu_users_is_llama31_with_zlabs_drafter():
    from bench.config import compose_config

    cfg = compose_config("method=dflash", "model=llama31_8b")
    assert cfg.model.path == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.method.drafter.checkpoint == "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"
    assert cfg.method.drafter.block_size is None  # the checkpoint's


@pytest.mark.real_model
def test_committed_dflash_is_lossless_on_smollm2():
    assert assert_lossless_on_smollm2("dflash", category="writing", count=2) > 1.1  # 1.16 (2026-12-04)


def test_a_negative_target_layer_is_refused_before_training(tiny_checkpoint, corpus, tmp_path):
    """train.recipe's list knobs are checked number by number (methods/heads/settings.py)."""
    from bench.errors import ConfigError
    from methods.heads.settings import TrainingRun

    cfg = train_config(tiny_checkpoint, corpus, tmp_path, "dflash", "train.target_layer_ids=[0,-1]")
    with pytest.raises(ConfigError, match=r"train.recipe.target_layer_ids\[1\]=-1: must be a number >= 0"):
        TrainingRun.from_config(cfg)


def test_published_copy_drops_our_fields_and_the_vocabulary_ids_and_keeps_the_rest(tmp_path):
    from safetensors.torch import load_file

    from methods.dflash.checkpoints import published_copy
    from methods.heads.saved import VOCABULARY_KEY

    tensors = write_published(tmp_path / "ours", specbench_method="dflash")
    save_file({**tensors, VOCABULARY_KEY: torch.arange(8)}, tmp_path / "ours" / "model.safetensors")
    out = published_copy(tmp_path / "ours", tmp_path / "published")
    config = json.loads((out / "config.json").read_text())
    assert "specbench_method" not in config and config["dflash_config"] == {"mask_token_id": MASK,
                                                                          "target_layer_ids": LAYER_IDS}
    copied = load_file(out / "model.safetensors")
    assert sorted(copied) == sorted(tensors) and all(torch.equal(copied[k], tensors[k]) for k in tensors)
