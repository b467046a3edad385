"""EAGLE-3 (Li et al. 2025): a one-layer draft over a fusion of three of the target's layers and a reduced vocabulary.

The head (SafeAILab/EAGLE `eagle/model/cnets.py`'s `Model`, with its parameter names):
- `fc` (3 h_target -> h, no bias) fuses the target's hidden states entering a low, a middle and a high decoder layer
  (upstream: layers 2, L//2 and L-3, i.e. transformers' `hidden_states[2]`, `[L//2]`, `[L-3]`);
- `midlayer`, one Llama decoder layer whose attention reads [input_layernorm(token embedding);
  hidden_norm(feature)] (q/k/v project 2h), with the un-normed feature as the residual;
- `norm` and `lm_head` over a draft vocabulary of `draft_vocab_size` ids; draft id d is target id d + d2t[d], and
  `t2d` marks the target ids in the draft vocabulary.

At the root the feature is the target's fused one (fc applied); deeper in the tree it is the head's own output for
the parent (fc skipped: it is already h wide), as upstream's `topK_genrate` feeds `out_hidden` back. The tree is
EAGLE-2's dynamic tree, built by methods/eagle.py's EagleDrafter (total_token, depth, top_k; upstream's EaModel
defaults 60 / 7 / 10); only the head and its vocabulary differ.

Checkpoints: SafeAILab's (`yuhuili/EAGLE3-*`: config.json with `draft_vocab_size`, pytorch_model.bin or
model.safetensors) and the speculators format that vLLM loads (config.json with `speculators_model_type: eagle3`,
`architectures: ["Eagle3Speculator"]`, `transformer_layer_config`, weights with `layers.0.*` for `midlayer.*`), both
loaded strictly (`load_eagle3`). `python -m bench.train method=eagle3` trains one (`Eagle3Recipe`, through
methods/heads/training.py) and writes SafeAILab's layout.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from bench.artifacts import artifact_fingerprint
from bench.engine.sampling import SamplingConfig
from bench.errors import InvalidArtifactError, MissingArtifactError
from methods.eagle import UPSTREAM_WEIGHTS, EagleDrafter, EagleRecipe, eagle_loss
from methods.heads.common import checkpoint_folder, load_strictly, read_json, read_tensors

TRAIN_COMMAND = "python -m bench.train method=eagle3"
UPSTREAM_HEADS = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B for meta-llama/Llama-3.1-8B-Instruct (model=llama31_8b)"
POINT_AT_A_HEAD = (f"set model.eagle3.checkpoint to the folder or hub id of an EAGLE-3 head made for this target "
                   f"(SafeAILab's or the speculators format, e.g. {UPSTREAM_HEADS})")
REFETCH = f"download the whole checkpoint folder again (huggingface-cli download <hub id>) or {POINT_AT_A_HEAD}"
SPECULATORS_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
NOT_LAYER_FIELDS = ("architectures", "model_type", "torch_dtype", "dtype")  # not for LlamaConfig


def eagle3_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Indices into transformers' `hidden_states` of the features EAGLE-3 fuses: the inputs of decoder layers 2, L//2
    and L-3 (upstream's modeling_llama_kv.py collects `hidden_states` before running layer idx for those idx;
    `hidden_states[i]` is layer i's input). For a target of fewer than 7 layers (the tests' tiny models), where
    upstream's three would coincide, each index is clamped into 1..L-1 and may repeat."""
    return tuple(min(max(i, 1), max(num_layers - 1, 1)) for i in (2, num_layers // 2, num_layers - 3))


def layer_config(fields: dict, attn_implementation: str | None = None) -> LlamaConfig:
    """The Llama config of the head's decoder layer (upstream always builds a Llama layer, whatever the target):
    sizes, activation, norm epsilon and rotary settings from `fields`, head_dim = hidden / heads as upstream's."""
    config = LlamaConfig(**{k: v for k, v in fields.items() if k not in NOT_LAYER_FIELDS})
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.num_hidden_layers, config.attention_bias, config.mlp_bias = 1, False, False
    config._attn_implementation = attn_implementation or "sdpa"
    return config


class Eagle3Layer(nn.Module):
    """upstream's `LlamaDecoderLayeremb`: attention over [input_layernorm(embedding); hidden_norm(feature)], the
    feature (or, with `norm_before_residual`, its normed value: speculators' option) as the residual, then the MLP."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # project the 2h-wide [embedding; feature]
            out = getattr(self.self_attn, name).out_features
            setattr(self.self_attn, name, nn.Linear(2 * hidden, out, bias=False))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, features, position_embeddings, attention_mask, cache):
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        inputs = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attended, _ = self.self_attn(inputs, position_embeddings, attention_mask, cache=cache)
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """fc -> midlayer -> (norm -> lm_head over the draft vocabulary); `d2t`, `t2d` the vocabulary maps. `forward`
    returns the midlayer's output (what is fed back for the next tree level); `logits` the draft-vocabulary logits.
    `embed_tokens` is the head's own embedding when its checkpoint carries one (else None: the target's is used)."""

    def __init__(self, config: LlamaConfig, target_hidden_size: int, target_vocab_size: int, draft_vocab_size: int,
                 feature_layers: tuple[int, ...], norm_before_residual: bool = False, own_embedding: bool = False):
        super().__init__()
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(target_vocab_size, hidden) if own_embedding else None
        self.fc = nn.Linear(len(feature_layers) * target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3Layer(config, norm_before_residual)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)  # no state: its frequencies are recomputed from the config
        self.feature_layers = tuple(feature_layers)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache=None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [B, T, h]; features [B, T, 3 h_target] (the target's: fused by fc) or [B, T, h] (the head's own
        outputs) -> [B, T, h]. Without position_ids / attention_mask: the T rows follow the cache, causally."""
        if features.shape[-1] == self.fc.in_features:
            features = self.fc(features)
        past = 0 if cache is None else cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + features.shape[1], device=features.device)[None]
        if attention_mask is None:
            attention_mask = causal_mask(features.shape[1], past, features.dtype, features.device)
        elif attention_mask.dtype == torch.bool:  # True: attend (the training-time test's unrolled_mask)
            attention_mask = additive_mask(attention_mask, features.dtype)
        position_embeddings = self.rotary(features, position_ids)
        return self.midlayer(embeds.to(features.dtype), features, position_embeddings, attention_mask, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., h] -> [..., draft vocabulary] logits."""
        return self.lm_head(self.norm(hidden))

    def to_token_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids: d + d2t[d]."""
        return draft_ids + self.d2t[draft_ids]


def causal_mask(rows: int, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, rows, past + rows] additive mask: every row sees the `past` cached positions and the rows up to itself."""
    allowed = torch.ones(rows, past + rows, dtype=torch.bool, device=device).tril(past)
    return additive_mask(allowed, dtype)[None, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as an additive one in `dtype` (what eager attention adds to its scores)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


class Eagle3Vocabulary:
    """The head's draft vocabulary in the part of DraftVocabulary's interface (methods/heads/common.py) that
    EagleDrafter's dynamic tree uses: logits over the draft ids, their count, their target ids."""

    def __init__(self, head: Eagle3Head):
        self.head = head
        self.size = head.lm_head.out_features

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.logits(hidden)

    def to_token_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return self.head.to_token_ids(positions)

    def slice_positions(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids (-100 outside the draft vocabulary, for cross-entropy's ignore_index)."""
        t2d = self.head.t2d
        draft_ids = t2d.long().cumsum(0) - 1
        return torch.where(t2d[token_ids], draft_ids[token_ids], -100)


class Eagle3Drafter(EagleDrafter):
    """EAGLE-2's dynamic tree (EagleDrafter's, upstream's `topK_genrate`) over an EAGLE-3 head: the target's three
    fused layers at the root, the head's own outputs deeper down, draft ids mapped to target ids by d2t."""

    def __init__(self, target, tokenizer=None, checkpoint: str | None = None, total_token: int = 60, depth: int = 7,
                 top_k: int = 10, sampling: SamplingConfig | None = None, seed: int | None = None,
                 head: Eagle3Head | None = None):
        artifact = None
        if head is None:
            head, artifact = load_eagle3(checkpoint, target)
        super().__init__(target, tokenizer, total_token=total_token, depth=depth, top_k=top_k, sampling=sampling,
                         seed=seed, head=head, vocab=Eagle3Vocabulary(head))
        self.artifact = artifact
        self.feature_layers = head.feature_layers
        if head.embed_tokens is not None:
            self.embed = head.embed_tokens


# --- checkpoints ------------------------------------------------------------------------------------------------

def load_eagle3(checkpoint: str | Path | None, target) -> tuple[Eagle3Head, str]:
    """(head, fingerprint) from SafeAILab's layout or the speculators one, on the target's device and dtype.

    Strict: every parameter and buffer must be in the file with its shape, and every file key must be used, except
    `embed_tokens.weight` (optional: the head's own embedding when present, as upstream and vLLM load it; else the
    target's), `d2t` / `t2d` when the draft vocabulary is the target's (upstream deletes them; identity maps) and
    `*.rotary_emb.inv_freq` (recomputed). Anything else missing, unexpected or mis-shaped is refused in one line."""
    if not checkpoint:
        raise MissingArtifactError(f"EAGLE-3 needs a trained head and none is configured for this model "
                                   f"(model.eagle3.checkpoint is unset); train one with: {TRAIN_COMMAND} "
                                   f"model=<model>, or {POINT_AT_A_HEAD}")
    folder = checkpoint_folder(checkpoint, "EAGLE-3")
    if not folder.exists():
        raise MissingArtifactError(f"EAGLE-3 head not found at {folder}; train it with: {TRAIN_COMMAND}, or "
                                   f"{POINT_AT_A_HEAD}")
    config = read_json(folder / "config.json", REFETCH)
    if not config:
        raise MissingArtifactError(f"{folder} has no config.json, so it is no EAGLE-3 checkpoint; {POINT_AT_A_HEAD}")
    speculators = is_speculators(config)
    names = SPECULATORS_WEIGHTS if speculators else UPSTREAM_WEIGHTS
    weights = next((folder / n for n in names if (folder / n).exists()), None)
    if weights is None:
        raise MissingArtifactError(f"{folder} holds no {' or '.join(names)}; {REFETCH}")
    tensors = read_tensors(weights, REFETCH)
    build = speculators_head if speculators else upstream_head
    head = build(folder, config, target, own_embedding="embed_tokens.weight" in tensors)
    same_vocab = head.lm_head.out_features == head.t2d.shape[0]
    file_key = speculators_key if speculators else (lambda key: key)
    load_strictly(head, tensors, weights, REFETCH, file_key=file_key,
                  provided={"d2t", "t2d"} if same_vocab else (),
                  dropped=lambda n: n.endswith("rotary_emb.inv_freq") or (same_vocab and n in ("d2t", "t2d")))
    return head.to(target.device, target.dtype).eval(), artifact_fingerprint(folder)


def speculators_key(key: str) -> str:
    """Eagle3Head key -> the speculators file's: `midlayer.*` -> `layers.0.*` (vLLM's llama_eagle3 reads both)."""
    return "layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key


def is_speculators(config: dict) -> bool:
    return config.get("speculators_model_type") == "eagle3" or "Eagle3Speculator" in config.get("architectures", [])


def upstream_head(folder: Path, config: dict, target, own_embedding: bool) -> Eagle3Head:
    """SafeAILab's head as its EaModel builds it from config.json (EConfig: num_key_value_heads defaults to the
    heads, rms_norm_eps 1e-6, rope_theta 10000 unless given; `target_hidden_size` when the head is narrower)."""
    if "draft_vocab_size" not in config:
        raise InvalidArtifactError(f"{folder / 'config.json'} has no draft_vocab_size, so it is no EAGLE-3 head (an "
                                   f"EAGLE-1/2 head? use method=eagle2 with model.eagle.checkpoint); {POINT_AT_A_HEAD}")
    fields = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048, **config}
    fields["num_key_value_heads"] = config.get("num_key_value_heads") or config["num_attention_heads"]
    return new_head(folder, layer_config(fields, target.config._attn_implementation), config, target, own_embedding)


def speculators_head(folder: Path, config: dict, target, own_embedding: bool) -> Eagle3Head:
    """The speculators format's head: the layer from `transformer_layer_config` (defaults: transformers' Llama
    config's, as speculators writes only the fields that differ), `norm_before_residual` as vLLM reads it (True
    when absent), the target layers from `eagle_aux_hidden_state_layer_ids` when given."""
    layer = dict(config.get("transformer_layer_config") or {})
    if config.get("norm_before_fc"):
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head with norm_before_fc, which methods/eagle3.py does not "
                                   f"build; {POINT_AT_A_HEAD}")
    if layer.get("num_hidden_layers", 1) != 1:
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head of {layer['num_hidden_layers']} decoder layers; "
                                   f"methods/eagle3.py builds one-layer heads; {POINT_AT_A_HEAD}")
    return new_head(folder, layer_config(layer, target.config._attn_implementation), config, target, own_embedding,
                    norm_before_residual=config.get("norm_before_residual", True))


def new_head(folder: Path, layer: LlamaConfig, config: dict, target, own_embedding: bool,
             norm_before_residual: bool = False) -> Eagle3Head:
    """The head for this target, after checking that the checkpoint was made for the target's widths."""
    target_config = target.config
    target_hidden = config.get("target_hidden_size") or layer.hidden_size
    if target_hidden != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} is an EAGLE-3 head for a target of hidden size {target_hidden}, this "
                                   f"target's is {target_config.hidden_size}; {POINT_AT_A_HEAD}")
    if not own_embedding and layer.hidden_size != target_config.hidden_size:
        raise InvalidArtifactError(f"{folder} has no embed_tokens.weight and its width {layer.hidden_size} is not the "
                                   f"target's {target_config.hidden_size}; {REFETCH}")
    layers = config.get("eagle_aux_hidden_state_layer_ids") or eagle3_feature_layers(target_config.num_hidden_layers)
    draft_vocab = int(config.get("draft_vocab_size") or target_config.vocab_size)  # vLLM: the target's when absent
    return Eagle3Head(layer, target_hidden, target_config.vocab_size, draft_vocab, tuple(layers), norm_before_residual,
                      own_embedding)


# --- training (methods/heads/training.py) ----------------------------------------------------------------------

def upstream_config(config, vocab_size: int, draft_vocab_size: int) -> dict:
    """config.json of a head trained here, in SafeAILab's layout (eagle/traineagle3/config.json's fields): the widths,
    activation, norm epsilon and rotary base of `config` (the target's, or the head's own layer config), one layer."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    fields = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": config.hidden_size,
              "intermediate_size": config.intermediate_size, "num_attention_heads": config.num_attention_heads,
              "num_key_value_heads": config.num_key_value_heads or config.num_attention_heads,
              "hidden_act": config.hidden_act, "rms_norm_eps": config.rms_norm_eps,
              "rope_theta": float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
              "max_position_embeddings": config.max_position_embeddings, "num_hidden_layers": 1,
              "tie_word_embeddings": False, "vocab_size": vocab_size, "draft_vocab_size": draft_vocab_size}
    if rope.get("rope_type", "default") != "default":
        fields["rope_scaling"] = rope
    return fields


class Eagle3Recipe(EagleRecipe):
    """Training recipe of an EAGLE-3 head, after SafeAILab's eagle/traineagle3: the target's three fused layers in
    (`feature_layers`: the cache stores them), the head unrolled on its own outputs for `ttt_steps` steps (EAGLE's
    training-time test, `eagle_loss`), loss sum_k ttt_decay^k x cross-entropy against the target's distribution over
    the draft vocabulary (upstream's soft target, from the target's top `soft_top_k` tokens the cache stores; 0: its
    argmax), positions whose argmax lies outside it skipped, as upstream's mask does; no feature regression and no
    input noise. The draft vocabulary (d2t / t2d) is the training set's most frequent target
    predictions. Written in SafeAILab's layout (config.json with draft_vocab_size, weights with d2t / t2d)."""

    method = "eagle3"

    def __init__(self, ttt_steps: int = 7, ttt_decay: float = 0.8, soft_top_k: int = 0):
        super().__init__(noise=0.0, feature_weight=0.0, token_weight=1.0, ttt_steps=ttt_steps, ttt_decay=ttt_decay)
        self.soft_top_k = soft_top_k

    def feature_layers(self, target) -> list[int]:
        return list(eagle3_feature_layers(target.config.num_hidden_layers))

    def build(self, target, tcfg) -> Eagle3Head:
        """A fresh head, built from its config.json as load_eagle3 builds it (so training and loading agree)."""
        vocab = target.config.vocab_size
        config = upstream_config(target.config, vocab, min(tcfg.get("draft_vocab_size") or vocab, vocab))
        return upstream_head(Path(str(tcfg.out_dir)), config, target, own_embedding=False).train()

    def loss(self, module: Eagle3Head, vocab, batch, target):
        """eagle_loss over the head's own draft vocabulary (`vocab`, the pipeline's slice of the target's LM head,
        holds the same ids and is not used)."""
        return eagle_loss(module, Eagle3Vocabulary(module), target.get_input_embeddings(), batch, self.noise,
                          self.feature_weight, self.token_weight, self.ttt_steps, self.ttt_decay)

    def checkpoint_config(self, module: Eagle3Head, tcfg) -> dict:
        return upstream_config(module.midlayer.self_attn.config, module.t2d.shape[0], module.lm_head.out_features)

    def set_vocabulary(self, module: Eagle3Head, token_ids: torch.Tensor | None) -> None:
        """d2t / t2d of a fresh head from the draft vocabulary's sorted target ids (None: the target's whole one)."""
        size, device = module.lm_head.out_features, module.d2t.device
        ids = torch.arange(size, device=device) if token_ids is None else token_ids.to(device)
        module.d2t.copy_(ids - torch.arange(size, device=device))
        module.t2d.zero_()[ids] = True

    def vocabulary_ids(self, module: Eagle3Head) -> torch.Tensor | None:
        """The head's draft vocabulary as sorted target ids (None: the target's whole vocabulary)."""
        if module.lm_head.out_features == module.t2d.shape[0]:
            return None
        return (torch.arange(module.d2t.shape[0], device=module.d2t.device) + module.d2t).cpu()
