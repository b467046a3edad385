"""EAGLE-3 (methods/eagle3/): upstream's and the speculators checkpoint layouts, the head against a plain-torch
reference forward, the feature layers, lossless greedy decoding, strict loading and the missing-head error."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

from bench.engine.batched import BatchedEngine
from bench.engine.loop import StopCondition, target_forward
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.eagle3.checkpoints import load_eagle3
from methods.eagle3.drafter import Eagle3Drafter, random_head
from methods.eagle3.head import Eagle3Head, eagle3_feature_layers
from tests.conftest import VOCAB, tiny_config, vanilla_tokens
from tests.method_checks import assert_lossless, assert_lossless_on_smollm2, drafter_from_config

DRAFT_VOCAB = 40


def random_eagle3_head(model, seed: int = 0, draft_vocab: int = DRAFT_VOCAB, std: float | None = None) -> Eagle3Head:
    """methods/eagle3/drafter.py's random_head, at this file's draft vocabulary by default."""
    return random_head(model, seed, draft_vocab, std)


def head_fields(config) -> dict:
    return {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
            "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
            "hidden_act": "silu", "vocab_size": config.vocab_size, "max_position_embeddings": 2048}


def write_upstream(folder, head: Eagle3Head, config, drop: str | None = None, extra: dict | None = None):
    """SafeAILab's layout: config.json (EConfig fields + draft_vocab_size) and pytorch_model.bin named as its Model."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in head.state_dict().items() if k != drop}
    torch.save({**state, **(extra or {})}, folder / "pytorch_model.bin")
    fields = {"architectures": ["LlamaForCausalLMEagle3"], **head_fields(config), "num_hidden_layers": 1,
              "rms_norm_eps": config.rms_norm_eps, "rope_theta": 10000.0, "draft_vocab_size": head.lm_head.out_features}
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def write_speculators(folder, head: Eagle3Head, model, drop: str | None = None, extra: dict | None = None):
    """The speculators layout vLLM loads: `layers.0.*` for `midlayer.*`, the embedding saved with the head, and a
    transformer_layer_config with only the fields that differ from transformers' Llama defaults (rms_norm_eps and
    rope_theta are the defaults here)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k.replace("midlayer.", "layers.0."): v for k, v in head.state_dict().items() if k != drop}
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    save_file({k: v.contiguous() for k, v in {**state, **(extra or {})}.items()}, folder / "model.safetensors")
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": {"model_type": "llama", **head_fields(model.config), "num_hidden_layers": 1},
              "draft_vocab_size": head.lm_head.out_features, "norm_before_residual": False,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def first_tree(drafter, model, prompt: list[int]):
    """The drafter's first tree after a prefill of `prompt`, with the prefill's features and root."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits, hidden = target_forward(model, drafter.feature_layers, input_ids=ids)
    drafter.start(prompt, hidden=hidden[0], seed=None)
    context = prompt + [int(logits[0, -1].argmax())]
    return drafter.propose(context, 100), context, hidden[0]


# --- a plain-torch reference forward of the head (upstream cnets.py's Model, without a cache) -------------------

def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta: float = 10000.0):
    """x [heads, T, d] rotated by RoPE at `positions` (the half-split convention of Llama)."""
    d = x.shape[-1]
    freqs = positions[:, None].double() / theta ** (torch.arange(0, d, 2).double() / d)  # [T, d/2]
    cos, sin = torch.cat([freqs.cos()] * 2, -1).to(x.dtype), torch.cat([freqs.sin()] * 2, -1).to(x.dtype)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def reference_layer(head, embeds, features, eps, norm_before_residual: bool = False):
    """midlayer over a whole sequence, causal, positions 0..T-1: [T, h] embeds, [T, h] features -> [T, h]; the
    residual is the feature (upstream) or its normed value (speculators' norm_before_residual)."""
    sd = {k: v for k, v in head.state_dict().items()}
    layer = lambda name: sd[f"midlayer.{name}.weight"]  # noqa: E731
    x = torch.cat([rms(embeds, layer("input_layernorm"), eps), rms(features, layer("hidden_norm"), eps)], -1)
    heads, kv_heads = 4, 2
    T, d = x.shape[0], features.shape[-1] // heads
    q = (x @ layer("self_attn.q_proj").T).view(T, heads, d).transpose(0, 1)
    k = (x @ layer("self_attn.k_proj").T).view(T, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
    v = (x @ layer("self_attn.v_proj").T).view(T, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
    positions = torch.arange(T)
    q, k = rotate(q, positions), rotate(k, positions)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(d) + torch.full((T, T), -math.inf).triu(1).to(q.dtype)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, -1) @ layer("self_attn.o_proj").T
    h = (rms(features, layer("hidden_norm"), eps) if norm_before_residual else features) + attended
    m = rms(h, layer("post_attention_layernorm"), eps)
    gate, up = m @ layer("mlp.gate_proj").T, m @ layer("mlp.up_proj").T
    return h + (torch.nn.functional.silu(gate) * up) @ layer("mlp.down_proj").T


def reference_children(head, model, tokens: list[int], features: torch.Tensor, k: int):
    """(top-k target ids, their log q, the head's output) at the last of the pairs (tokens[t], features[t])."""
    sd, eps = head.state_dict(), model.config.rms_norm_eps
    embeds = model.get_input_embeddings().weight[torch.tensor(tokens)]
    out = reference_layer(head, embeds, features, eps)[-1]
    logq = (rms(out, sd["norm.weight"], eps) @ sd["lm_head.weight"].T).log_softmax(-1)
    values, draft_ids = logq.topk(k)
    return (draft_ids + sd["d2t"][draft_ids]).tolist(), values, out


# --- tests -----------------------------------------------------------------------------------------------------

def test_feature_layers_are_the_inputs_of_layers_2_half_and_minus_3():
    assert eagle3_feature_layers(32) == (2, 16, 29)  # Llama-3.1-8B (vLLM's default aux layers too)
    assert eagle3_feature_layers(30) == (2, 15, 27)  # SmolLM2-135M
    assert eagle3_feature_layers(2) == (1, 1, 1)  # the tiny test models: clamped, repeated
    model = LlamaForCausalLM(tiny_config(num_hidden_layers=8)).double().eval()
    inputs = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda _, args, kwargs, i=i: inputs.__setitem__(i, (args or
                                        (kwargs["hidden_states"],))[0]), with_kwargs=True)
    with torch.no_grad():
        hidden = model(torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True).hidden_states
    for i in eagle3_feature_layers(8):  # hidden_states[i] is what enters decoder layer i
        torch.testing.assert_close(hidden[i], inputs[i], rtol=0, atol=0)


def test_parameter_names_are_upstreams(tiny_model):
    names = set(random_eagle3_head(tiny_model).state_dict())
    layer = {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")} | {
        f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    assert names == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | layer


def test_both_layouts_load_and_propose_the_reference_tree(tiny_model, prompts, tmp_path, one_thread):
    """Both layouts give the same first tree, and its two levels are a plain-torch forward's: the root's children
    from the fused target feature, each child's children from the head's own output at the root fed back."""
    head = random_eagle3_head(tiny_model, 3, std=0.3)
    k, shape = 3, {"total_token": 1 + 3 + 9, "depth": 1, "top_k": 3}  # every candidate kept
    trees = []
    writers = (lambda f: write_upstream(f, head, tiny_model.config), lambda f: write_speculators(f, head, tiny_model))
    for write in writers:
        folder = write(tmp_path / f"layout{len(trees)}")
        trees.append(first_tree(Eagle3Drafter(tiny_model, checkpoint=str(folder), **shape), tiny_model, prompts[1]))
    (tree, context, hidden), (other, _, _) = trees
    assert (tree.tokens, tree.parents) == (other.tokens, other.parents)
    assert any(head.d2t[d] != 0 for d in range(DRAFT_VOCAB))

    sd = head.state_dict()
    fused = hidden @ sd["fc.weight"].T  # [P, h]: f_t for the pairs (token t+1, f_t)
    roots, root_logq, root_out = reference_children(head, tiny_model, context[1:], fused, k)
    assert [t for t, p in zip(tree.tokens, tree.parents) if p < 0] == roots
    expected = set()
    for token, logq in zip(roots, root_logq):
        children, child_logq, _ = reference_children(head, tiny_model, context[1:] + [token],
                                                     torch.cat([fused, root_out[None]]), k)
        expected |= {(token, c) for c in children}
    got = {(tree.tokens[p], t) for t, p in zip(tree.tokens, tree.parents) if p >= 0}
    assert got == expected and len(tree) == k + k * k


@pytest.mark.parametrize("given", [None, False, True])
def test_speculators_options_norm_before_residual_and_aux_layers(tiny_model, tmp_path, given):
    """norm_before_residual as vLLM reads it (True when the config lacks it); eagle_aux_hidden_state_layer_ids, when
    given, are the target layers fused."""
    head = random_eagle3_head(tiny_model, 9, std=0.3)
    folder = write_speculators(tmp_path / "h", head, tiny_model)
    config = json.loads((folder / "config.json").read_text())
    del config["norm_before_residual"]
    if given is not None:
        config.update(norm_before_residual=given, eagle_aux_hidden_state_layer_ids=[0, 1, 1])
    (folder / "config.json").write_text(json.dumps(config))
    loaded, _ = load_eagle3(folder, tiny_model)
    assert loaded.feature_layers == ((0, 1, 1) if given is not None else (1, 1, 1))
    embeds, features = torch.randn(2, 6, 64, dtype=torch.float64).unbind()
    with torch.no_grad():
        out = loaded(embeds[None], features[None])[0]
    expected = reference_layer(head, embeds, features, tiny_model.config.rms_norm_eps, given is not False)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)  # HF computes the rotary angles in float32


@pytest.mark.parametrize("shape", [(8, 3, 2), (10, 4, 3), (60, 7, 10)])
def test_greedy_eagle3_equals_vanilla(tiny_model, prompts, tmp_path, shape, one_thread):
    total_token, depth, top_k = shape
    folder = write_upstream(tmp_path / "head", random_eagle3_head(tiny_model, 4, std=0.3), tiny_model.config)
    drafter = Eagle3Drafter(tiny_model, checkpoint=str(folder), total_token=total_token, depth=depth, top_k=top_k)
    sizes, accepted = [], []
    for prompt in prompts:
        out = assert_lossless(tiny_model, drafter, prompt, 40)
        sizes += [n - 1 for n in out.verified_tokens]
        accepted += out.accept_lengths
    assert max(sizes) == min(total_token - 1, top_k + depth * top_k * top_k)
    assert max(accepted) >= 2  # some drafts were accepted


def test_batched_eagle3_equals_vanilla(tiny_model, prompts, one_thread):
    drafter = Eagle3Drafter(tiny_model, head=random_eagle3_head(tiny_model, 5, std=0.3), total_token=8, depth=3,
                            top_k=2)
    out = BatchedEngine(tiny_model, drafter).generate(prompts, StopCondition(24), [None] * len(prompts))
    assert [t.tokens for t in out.turns] == [vanilla_tokens(tiny_model, p, 24) for p in prompts]


@pytest.mark.parametrize("layout", ["upstream", "speculators"])
@pytest.mark.parametrize("fault", ["missing", "unexpected"])
def test_strict_loading_refuses_a_missing_or_unexpected_key(tiny_model, tmp_path, layout, fault):
    head = random_eagle3_head(tiny_model, 6)
    drop = "midlayer.hidden_norm.weight" if fault == "missing" else None
    extra = {"midlayer.extra.weight": torch.zeros(2)} if fault == "unexpected" else None
    if layout == "upstream":
        folder, weights = write_upstream(tmp_path / "h", head, tiny_model.config, drop, extra), "pytorch_model.bin"
    else:
        folder, weights = write_speculators(tmp_path / "h", head, tiny_model, drop, extra), "model.safetensors"
    key = {"upstream": "midlayer.", "speculators": "layers.0."}[layout] + "hidden_norm.weight"
    expected = f"1 key missing ({key})" if fault == "missing" else "1 key unexpected (midlayer.extra.weight)"
    with pytest.raises(InvalidArtifactError) as err:
        load_eagle3(folder, tiny_model)
    message = str(err.value)
    assert "\n" not in message and str(folder / weights) in message and expected in message
    assert "method.drafter.checkpoint" in message


def test_heads_for_another_target_or_eagle1_heads_are_refused(tiny_model, tmp_path):
    head = random_eagle3_head(tiny_model, 7)
    folder = write_upstream(tmp_path / "wide", head, tiny_model.config)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "target_hidden_size": 128}))
    with pytest.raises(InvalidArtifactError, match="for a target of hidden size 128, this target's is 64"):
        load_eagle3(folder, tiny_model)
    del config["draft_vocab_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArtifactError, match="no draft_vocab_size.*method=eagle2"):
        load_eagle3(folder, tiny_model)


def test_full_vocabulary_head_needs_no_maps(tiny_model, prompts, tmp_path, one_thread):
    """A head whose draft vocabulary is the target's (upstream then deletes d2t / t2d): loads without them."""
    head = random_eagle3_head(tiny_model, 8, draft_vocab=VOCAB, std=0.3)
    head.d2t.zero_()
    folder = write_upstream(tmp_path / "full", head, tiny_model.config, drop="d2t")
    state = torch.load(folder / "pytorch_model.bin")
    del state["t2d"]
    torch.save(state, folder / "pytorch_model.bin")
    loaded, _ = load_eagle3(folder, tiny_model)
    assert loaded.d2t.abs().sum() == 0
    assert_lossless(tiny_model, Eagle3Drafter(tiny_model, head=loaded, total_token=8, depth=3, top_k=2), prompts[0], 20)


@pytest.mark.parametrize("checkpoint", ["null", "untrained"])
def test_missing_head_says_how_to_train_one_or_point_at_one(tiny_model, tmp_path, checkpoint):
    """No method.drafter.checkpoint, or one pointing at a folder not trained yet (SmolLM2's before its training)."""
    folder = tmp_path / "eagle3"
    with pytest.raises(MissingArtifactError) as err:
        drafter_from_config("eagle3", tiny_model, None,
                            f"method.drafter.checkpoint={'null' if checkpoint == 'null' else folder}")
    message = str(err.value)
    assert "\n" not in message and "python -m bench.train method=eagle3" in message
    assert "method.drafter.checkpoint" in message and "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in message
    assert ("is unset" if checkpoint == "null" else f"not found at {folder}") in message


def test_checkpoint_folder_without_config_is_missing(tiny_model, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingArtifactError, match="has no config.json"):
        load_eagle3(tmp_path / "empty", tiny_model)


@pytest.mark.real_model
def test_committed_eagle3_head_is_lossless_on_smollm2():
    """The committed SmolLM2 head (artifacts/eagle3/smollm2_135m) through the config's CPU tree equals vanilla."""
    mean_accepted = assert_lossless_on_smollm2("eagle3", category="writing", count=2)
    assert mean_accepted > 1.3
