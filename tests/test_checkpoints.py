"""Published checkpoint layouts load as their authors' code loads them (methods/medusa/, eagle/, hydra/, sps/).

Each tiny checkpoint is written in its upstream layout from the key names alone; the drafter's first proposal must
equal a reference forward written here in plain torch ops from upstream's architecture. A checkpoint with a missing
or unexpected key, or a truncated file, is refused in one line that names the file and the command that fixes it.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from torch.nn.functional import silu

from bench.artifacts import PROJECT_ROOT
from bench.errors import InvalidArtifactError
from methods.eagle.checkpoints import load_eagle
from methods.eagle.static import Eagle1Drafter
from methods.hydra.checkpoints import load_hydra
from methods.medusa.checkpoints import load_medusa
from methods.medusa.drafter import MedusaDrafter
from methods.sps.draft import load_draft, save_draft, slice_target
from tests.conftest import VOCAB, make_tiny_model, tiny_overrides
from tests.test_hydra import write_upstream_checkpoint as write_hydra_plus_plus

HIDDEN = 64
PROMPT = [5, 17, 3, 42, 9, 11, 60, 2, 33]
MEDUSA_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # three heads deep
EAGLE_CHOICES = [[0], [1], [0, 0]]


@torch.no_grad()
def target_features(model, ids: list[int]) -> torch.Tensor:
    """The target's last (post-norm) hidden states [T, H]."""
    return model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def first_proposal(drafter, model) -> list[tuple[int, ...]]:
    """The drafter's first tree after the prompt's prefill, as the sorted token paths (depth 1 first) of its nodes."""
    features = target_features(model, PROMPT)
    root = int(model.get_output_embeddings()(features[-1]).argmax())
    drafter.start(PROMPT, hidden=features)
    tree = drafter.propose(PROMPT + [root], max_tokens=64)
    paths = []
    for node in range(len(tree.tokens)):
        path = []
        while node >= 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        paths.append(tuple(path[::-1]))
    return sorted(paths)


def random_tensor(*shape, scale: float = 0.3) -> torch.Tensor:
    return (torch.randn(*shape) * scale).half()  # upstream ships fp16 weights


def assert_one_line_refusal(error, *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def truncate(file) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


# --- Medusa ----------------------------------------------------------------------------------------------------------

def medusa_head_state(num_heads: int, num_layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """FasterDecoding's keys: `{head}.{layer}.linear.weight/bias`, `{head}.{num_layers}.weight`. Upstream repeats one
    ResBlock module per head, so its saved copies are equal; the earlier copies here are noise that upstream's
    load_state_dict would overwrite with the last one."""
    torch.manual_seed(seed)
    state = {}
    for k in range(num_heads):
        for layer in range(num_layers):
            state[f"{k}.{layer}.linear.weight"] = random_tensor(HIDDEN, HIDDEN, scale=0.2)
            state[f"{k}.{layer}.linear.bias"] = random_tensor(HIDDEN, scale=0.2)
        state[f"{k}.{num_layers}.weight"] = random_tensor(VOCAB, HIDDEN, scale=1.0)
    return state


def medusa_reference(state: dict[str, torch.Tensor], hidden: torch.Tensor, num_layers: int,
                     choices: list[list[int]]) -> list[tuple[int, ...]]:
    """Upstream's Medusa head k: x <- x + SiLU(W x + b) num_layers times with the head's one ResBlock (the last
    stored copy), then its own projection; node (r_1 .. r_d) is the path of head i's r_i-th best tokens."""
    def ranked(k):
        w, b = (state[f"{k}.{num_layers - 1}.linear.{n}"].double() for n in ("weight", "bias"))
        x = hidden
        for _ in range(num_layers):
            x = x + silu(w @ x + b)
        return (state[f"{k}.{num_layers}.weight"].double() @ x).argsort(descending=True).tolist()

    tokens = [ranked(k) for k in range(max(len(c) for c in choices))]
    return sorted(tuple(tokens[i][r] for i, r in enumerate(path)) for path in choices)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_faster_decoding_medusa1_with_an_under_counting_config(tiny_model, tmp_path, num_layers):
    """As on the hub (FasterDecoding/medusa-vicuna-7b-v1.3): config.json says 2 heads, medusa_lm_head.pt holds 3."""
    state = medusa_head_state(3, num_layers)
    folder = tmp_path / "medusa-1"
    folder.mkdir()
    torch.save(state, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": num_layers,
                                                    "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    with pytest.warns(UserWarning, match="declares 2 Medusa heads .* hold 3 of") as warned:
        drafter = MedusaDrafter(tiny_model, checkpoint=str(folder), choices=MEDUSA_CHOICES)
    assert len(warned) == 1 and drafter.heads.num_heads == 3
    hidden = target_features(tiny_model, PROMPT)[-1]
    assert first_proposal(drafter, tiny_model) == medusa_reference(state, hidden, num_layers, MEDUSA_CHOICES)


def write_medusa2(folder, model, heads: dict[str, torch.Tensor], layout: str) -> None:
    """A Medusa-2 full-model folder as save_pretrained writes it: the base model's config with medusa_num_heads /
    medusa_num_layers, and one state dict holding the base (`model.*`, `lm_head.*`) and the heads (`medusa_head.*`),
    in one pytorch_model.bin or in two safetensors shards listed by model.safetensors.index.json."""
    folder.mkdir()
    state = {k: v.detach().clone().half() for k, v in model.state_dict().items()}
    state.update({f"medusa_head.{k}": v for k, v in heads.items()})
    (folder / "config.json").write_text(json.dumps({**model.config.to_dict(), "medusa_num_heads": 3,
                                                    "medusa_num_layers": 1, "architectures": ["MedusaModelLlama"]}))
    if layout == "bin":
        torch.save(state, folder / "pytorch_model.bin")
        return
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("model.")},
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if not k.startswith("model.")}}
    for name, tensors in shards.items():
        save_file(tensors, folder / name, metadata={"format": "pt"})
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("layout", ["sharded-safetensors", "bin"])
def test_medusa2_full_model_checkpoint(tiny_model, tmp_path, layout):
    heads = medusa_head_state(3, 1, seed=1)
    write_medusa2(tmp_path / "medusa-2", tiny_model, heads, layout)
    drafter = MedusaDrafter(tiny_model, checkpoint=str(tmp_path / "medusa-2"), choices=MEDUSA_CHOICES)
    hidden = target_features(tiny_model, PROMPT)[-1]
    assert first_proposal(drafter, tiny_model) == medusa_reference(heads, hidden, 1, MEDUSA_CHOICES)


def test_medusa_with_a_missing_or_misshapen_tensor_is_refused(tiny_model, tmp_path):
    state = medusa_head_state(3, 1)
    del state["1.0.linear.bias"]
    folder = tmp_path / "medusa-1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    torch.save(state, folder / "medusa_lm_head.pt")
    with pytest.raises(InvalidArtifactError) as error:
        load_medusa(folder, tiny_model)
    assert_one_line_refusal(error, str(folder / "medusa_lm_head.pt"), "1 key missing (1.0.linear.bias)",
                            "python -m bench.train method=medusa")
    state["1.0.linear.bias"] = random_tensor(HIDDEN + 1)  # tensors that cannot form a head
    state["2.1.weight"] = random_tensor(VOCAB, HIDDEN + 1)
    torch.save(state, folder / "medusa_lm_head.pt")
    with pytest.raises(InvalidArtifactError) as error:
        load_medusa(folder, tiny_model)
    assert_one_line_refusal(error, "2 keys of the wrong shape (1.0.linear.bias [65] not [64], 2.1.weight [96, 65] "
                                   "not [96, 64])", "python -m bench.train method=medusa")
    heads = medusa_head_state(3, 1)
    del heads["2.1.weight"]
    write_medusa2(tmp_path / "medusa-2", tiny_model, heads, "bin")
    with pytest.raises(InvalidArtifactError) as error:
        load_medusa(tmp_path / "medusa-2", tiny_model)
    assert_one_line_refusal(error, f"{tmp_path / 'medusa-2'} (medusa_head.* tensors)", "1 key missing (2.1.weight)")


def truncated_medusa1(tmp_path):
    """A FasterDecoding Medusa-1 folder whose medusa_lm_head.pt is cut short."""
    folder = tmp_path / "medusa-1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 3}))
    torch.save(medusa_head_state(3, 1), folder / "medusa_lm_head.pt")
    truncate(folder / "medusa_lm_head.pt")
    return folder


def test_truncated_medusa_files_are_refused(tiny_model, tmp_path):
    folder = truncated_medusa1(tmp_path)
    with pytest.raises(InvalidArtifactError) as error:
        load_medusa(folder, tiny_model)
    assert_one_line_refusal(error, f"{folder / 'medusa_lm_head.pt'} cannot be read", "truncated or corrupt",
                            "python -m bench.train method=medusa")
    write_medusa2(tmp_path / "medusa-2", tiny_model, medusa_head_state(3, 1), "sharded-safetensors")
    shard = tmp_path / "medusa-2" / "model-00002-of-00002.safetensors"
    truncate(shard)
    with pytest.raises(InvalidArtifactError) as error:
        load_medusa(tmp_path / "medusa-2", tiny_model)
    assert_one_line_refusal(error, f"{shard} cannot be read (SafetensorError", "truncated or corrupt")


def test_the_cli_refuses_a_truncated_checkpoint_with_exit_status_2(tiny_checkpoint, tmp_path):
    folder = truncated_medusa1(tmp_path)
    command = [sys.executable, "-m", "bench", "method=medusa", f"method.drafter.checkpoint={folder}",
               *tiny_overrides(tiny_checkpoint, tmp_path / "run"), "hydra.run.dir=" + str(tmp_path / "hydra")]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and "medusa_lm_head.pt cannot be read" in errors[0] and "Traceback" not in done.stderr


# --- EAGLE -----------------------------------------------------------------------------------------------------------

def eagle_config(**fields) -> dict:
    """A SafeAILab head config.json: the base model's fields, one layer, and `bias`."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": HIDDEN,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "max_position_embeddings": 512, "bias": True, **fields}


def eagle_state(config: dict, model, seed: int = 0) -> dict[str, torch.Tensor]:
    """SafeAILab's keys: fc.*, layers.0.* (no input norm in layer 0) and the base model's embed_tokens copy."""
    torch.manual_seed(seed)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"fc.weight": (hidden, 2 * hidden), "layers.0.self_attn.q_proj.weight": (q, hidden),
              "layers.0.self_attn.k_proj.weight": (kv, hidden), "layers.0.self_attn.v_proj.weight": (kv, hidden),
              "layers.0.self_attn.o_proj.weight": (hidden, q), "layers.0.mlp.gate_proj.weight": (inner, hidden),
              "layers.0.mlp.up_proj.weight": (inner, hidden), "layers.0.mlp.down_proj.weight": (hidden, inner)}
    state = {key: random_tensor(*shape, scale=0.15) for key, shape in shapes.items()}
    if config.get("bias", True):
        state["fc.bias"] = random_tensor(hidden)
    state["layers.0.post_attention_layernorm.weight"] = (1 + torch.randn(hidden) * 0.1).half()
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().half()
    return state


def write_eagle(folder, config: dict, state: dict[str, torch.Tensor], file: str) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if file == "model.safetensors":
        save_file(state, folder / file, metadata={"format": "pt"})
    else:
        torch.save(state, folder / file)


def eagle_layer_reference(state, config: dict, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """SafeAILab's EAGLE-1 head over T positions from 0: x = fc(cat(e, f)); one Llama decoder layer without its
    input norm (causal GQA attention with rotary base rope_theta, else 10000), post-attention RMSNorm, SwiGLU MLP."""
    w = {k: v.double() for k, v in state.items()}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    steps, hidden = embeds.shape
    d = hidden // heads
    x = torch.cat([embeds, features], -1) @ w["fc.weight"].T + (w["fc.bias"] if "fc.bias" in w else 0)

    def project(name, count):
        return (x @ w[f"layers.0.self_attn.{name}_proj.weight"].T).view(steps, count, d).transpose(0, 1)

    q, k, v = project("q", heads), project("k", kv_heads), project("v", kv_heads)
    inv_freq = 1.0 / config.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(steps, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotate(t):
        return t * cos + torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1) * sin

    q, k = rotate(q), rotate(k).repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(steps, steps, dtype=torch.bool).triu(1), float("-inf"))
    attended = (scores.softmax(-1) @ v.repeat_interleave(heads // kv_heads, 0)).transpose(0, 1).reshape(steps, -1)
    h = x + attended @ w["layers.0.self_attn.o_proj.weight"].T
    normed = h * (h.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]).rsqrt()
    normed = normed * w["layers.0.post_attention_layernorm.weight"]
    mlp = (silu(normed @ w["layers.0.mlp.gate_proj.weight"].T) * (normed @ w["layers.0.mlp.up_proj.weight"].T))
    return h + mlp @ w["layers.0.mlp.down_proj.weight"].T


def eagle_reference(state, config: dict, model) -> list[tuple[int, ...]]:
    """EAGLE_CHOICES drafted by the reference head: pairs (token t+1, f_t) over the prompt, the root's predicted
    feature through the target's lm_head gives the depth-1 top-2; the pair (best depth-1 token, that feature) gives
    its child."""
    features = target_features(model, PROMPT)
    lm_head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    root = int(lm_head(features[-1]).argmax())
    with torch.no_grad():
        tokens = torch.tensor(PROMPT[1:] + [root])
        predicted = eagle_layer_reference(state, config, embed(tokens), features)[-1]
        first, second = lm_head(predicted).topk(2).indices.tolist()
        deeper = eagle_layer_reference(state, config, embed(torch.cat([tokens, torch.tensor([first])])),
                                       torch.cat([features, predicted[None]]))[-1]
    return sorted([(first,), (second,), (first, int(lm_head(deeper).argmax()))])


@pytest.mark.parametrize("case", ["bias", "no-bias"])
def test_safeailab_eagle_head(tiny_model, tmp_path, case):
    """`"bias": false` (SafeAILab's LLaMA-3 heads) builds fc without a bias; the head's own config.json shapes its
    layer (here an intermediate size, rotary base and norm epsilon other than the target's)."""
    if case == "bias":
        config, file = eagle_config(), "pytorch_model.bin"
    else:
        config, file = eagle_config(bias=False, intermediate_size=96, rope_theta=500000.0, rms_norm_eps=1e-5), \
            "model.safetensors"
    state = eagle_state(config, tiny_model)
    write_eagle(tmp_path / "eagle", config, state, file)
    head, vocab, _ = load_eagle(tmp_path / "eagle", tiny_model)
    assert (head.fc.bias is None) == (case == "no-bias") and vocab.size == VOCAB
    assert head.body.layers[0].mlp.up_proj.out_features == config["intermediate_size"]
    drafter = Eagle1Drafter(tiny_model, checkpoint=str(tmp_path / "eagle"), choices=EAGLE_CHOICES)
    assert first_proposal(drafter, tiny_model) == eagle_reference(state, config, tiny_model)


def test_eagle_with_a_missing_or_unexpected_key_is_refused(tiny_model, tmp_path):
    config = eagle_config()
    state = eagle_state(config, tiny_model)
    del state["layers.0.mlp.up_proj.weight"]
    write_eagle(tmp_path / "missing", config, state, "pytorch_model.bin")
    with pytest.raises(InvalidArtifactError) as error:
        load_eagle(tmp_path / "missing", tiny_model)
    assert_one_line_refusal(error, str(tmp_path / "missing" / "pytorch_model.bin"),
                            "1 key missing (layers.0.mlp.up_proj.weight)", "python -m bench.train method=eagle")
    state = eagle_state(eagle_config(bias=False), tiny_model)  # the file has no fc.bias: config.json must say so
    write_eagle(tmp_path / "undeclared", config, state, "model.safetensors")
    with pytest.raises(InvalidArtifactError) as error:
        load_eagle(tmp_path / "undeclared", tiny_model)
    assert_one_line_refusal(error, "1 key missing (fc.bias)")
    state = {**eagle_state(config, tiny_model), "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
             "d2t": torch.zeros(3)}  # EAGLE-3 keys
    write_eagle(tmp_path / "eagle3", config, state, "pytorch_model.bin")
    with pytest.raises(InvalidArtifactError) as error:
        load_eagle(tmp_path / "eagle3", tiny_model)
    assert_one_line_refusal(error, "2 keys unexpected (d2t, midlayer.hidden_norm.weight)")


def test_truncated_eagle_file_is_refused(tiny_model, tmp_path):
    write_eagle(tmp_path / "eagle", eagle_config(), eagle_state(eagle_config(), tiny_model), "model.safetensors")
    truncate(tmp_path / "eagle" / "model.safetensors")
    with pytest.raises(InvalidArtifactError) as error:
        load_eagle(tmp_path / "eagle", tiny_model)
    assert_one_line_refusal(error, f"{tmp_path / 'eagle' / 'model.safetensors'} cannot be read (SafetensorError",
                            "truncated or corrupt", "python -m bench.train method=eagle")


# --- Hydra++ ---------------------------------------------------------------------------------------------------------

def test_hydra_plus_plus_with_a_missing_or_unexpected_key_is_refused(tiny_model, tmp_path):
    state, _ = write_hydra_plus_plus(tiny_model, tmp_path / "hydra++", num_heads=2, num_layers=3)
    file = tmp_path / "hydra++" / "hydra_lm_head.pt"
    stored = torch.load(file, weights_only=True)
    assert load_hydra(tmp_path / "hydra++", tiny_model)[0].num_heads == 2  # complete: loads
    del stored["hydra_mlp.1.1.res_connection.bias"]
    stored["hydra_mlp.0.9.linear.weight"] = torch.zeros(HIDDEN, HIDDEN)  # beyond the 3 layers config.json declares
    torch.save(stored, file)
    with pytest.raises(InvalidArtifactError) as error:
        load_hydra(tmp_path / "hydra++", tiny_model)
    assert_one_line_refusal(error, str(file), "1 key missing (hydra_mlp.1.1.res_connection.bias)",
                            "1 key unexpected (hydra_mlp.0.9.linear.weight)", "python -m bench.train method=hydra")
    truncate(file)
    with pytest.raises(InvalidArtifactError) as error:
        load_hydra(tmp_path / "hydra++", tiny_model)
    assert_one_line_refusal(error, f"{file} cannot be read", "truncated or corrupt")


# --- SpS drafts ------------------------------------------------------------------------------------------------------

def test_hugging_face_draft_folder_loads_strictly(tiny_model, tmp_path):
    from safetensors.torch import load_file

    draft = make_tiny_model(seed=3)
    draft.save_pretrained(tmp_path / "draft")
    loaded = load_draft(tmp_path / "draft", tiny_model)
    assert all(torch.equal(v, draft.state_dict()[k]) for k, v in loaded.state_dict().items())
    weights = tmp_path / "draft" / "model.safetensors"
    state = load_file(weights)
    del state["model.norm.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(InvalidArtifactError) as error:  # transformers alone would initialise it at random
        load_draft(tmp_path / "draft", tiny_model)
    assert_one_line_refusal(error, f"SpS draft '{tmp_path / 'draft'}'", "1 key missing (model.norm.weight)",
                            "set method.drafter.draft_path")
    truncate(weights)
    with pytest.raises(InvalidArtifactError) as error:
        load_draft(tmp_path / "draft", tiny_model)
    assert_one_line_refusal(error, f"SpS draft '{tmp_path / 'draft'}'", "cannot be read (SafetensorError",
                            "truncated or corrupt")


def test_own_sps_draft_with_a_missing_key_is_refused(tiny_model, tmp_path):
    from safetensors.torch import load_file

    save_draft(slice_target(tiny_model, [1]), tmp_path / "draft", {})
    weights = tmp_path / "draft" / "model.safetensors"
    state = load_file(weights)
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(InvalidArtifactError) as error:
        load_draft(tmp_path / "draft", tiny_model)
    assert_one_line_refusal(error, str(weights), "1 key missing (model.layers.0.mlp.up_proj.weight)",
                            "python -m bench.train method=sps")
