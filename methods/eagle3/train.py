"""EAGLE-3's training recipe (methods/heads/training.py), after SafeAILab's eagle/traineagle3."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from bench.errors import ConfigError
from methods.eagle.train import EagleRecipe, eagle_loss
from methods.eagle3.checkpoints import upstream_head
from methods.eagle3.head import Eagle3Head, Eagle3Vocabulary, eagle3_feature_layers
from methods.heads.settings import RECIPE_CHOICES

TARGET_DISTRIBUTIONS = RECIPE_CHOICES["target_distribution"]
FULL_SOFTMAX_RECORD = ("the target's full softmax over the draft vocabulary (upstream's), recomputed for each batch "
                       "from the cached input of layer L-3 through the target's last layers")


@torch.no_grad()
def draft_vocabulary_logprobs(target, hidden: torch.Tensor, first_layer: int,
                              vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """The target's log-probabilities over the draft vocabulary ([B, S, V'] float32; `vocab_ids` None: the whole
    vocabulary) at every position of sequences whose input to decoder layer `first_layer` is `hidden` ([B, S, h],
    sequences starting at position 0): the target's layers from `first_layer` on, its final norm and its LM head's
    rows of the draft vocabulary, under a causal mask."""
    model = target.model
    hidden = hidden.to(target.dtype)
    length = hidden.shape[1]
    positions = torch.arange(length, device=hidden.device)[None]
    mask = torch.full((length, length), float("-inf"), dtype=hidden.dtype, device=hidden.device).triu(1)[None, None]
    rotary = model.rotary_emb(hidden, positions)
    for layer in model.layers[first_layer:]:
        out = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        hidden = out[0] if isinstance(out, tuple) else out
    weight = target.get_output_embeddings().weight
    weight = weight if vocab_ids is None else weight[vocab_ids.to(weight.device)]
    return (model.norm(hidden) @ weight.T).float().log_softmax(-1)


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

    def __init__(self, ttt_steps: int = 7, ttt_decay: float = 0.8, soft_top_k: int = 0,
                 target_distribution: str = "top_k"):
        super().__init__(noise=0.0, feature_weight=0.0, token_weight=1.0, ttt_steps=ttt_steps, ttt_decay=ttt_decay)
        if target_distribution not in TARGET_DISTRIBUTIONS:
            raise ConfigError(f"train.recipe.target_distribution={target_distribution}: must be one of "
                              f"{', '.join(TARGET_DISTRIBUTIONS)}")
        self.full_softmax = target_distribution == "full"
        # the cached top-k the loss reads: none for the full softmax (recomputed) or the argmax
        self.soft_top_k = soft_top_k if target_distribution == "top_k" else 0

    def feature_layers(self, target) -> list[int]:
        return list(eagle3_feature_layers(target.config.num_hidden_layers))

    def build(self, target, tcfg) -> Eagle3Head:
        """A fresh head, built from its config.json as load_eagle3 builds it (so training and loading agree)."""
        vocab = target.config.vocab_size
        config = upstream_config(target.config, vocab, min(tcfg.get("draft_vocab_size") or vocab, vocab))
        return upstream_head(Path(str(tcfg.out_dir)), config, target, own_embedding=False).train()

    def loss(self, module: Eagle3Head, vocab, batch, target):
        """eagle_loss over the head's own draft vocabulary (`vocab`, the pipeline's slice of the target's LM head,
        holds the same ids and is not used); with the full softmax, the target's log-probabilities over the draft
        vocabulary are recomputed for the batch first (`draft_vocabulary_logprobs`)."""
        if self.full_softmax:
            last = batch.hidden.shape[-1] // 3  # the input of layer L-3, the last of the three fused layers
            logprobs = draft_vocabulary_logprobs(target, batch.hidden[..., -last:], self.feature_layers(target)[-1],
                                                 self.vocabulary_ids(module))
            batch = replace(batch, soft_ids=None, soft_logprobs=logprobs)
        return eagle_loss(module, Eagle3Vocabulary(module), target.get_input_embeddings(), batch, self.noise,
                          self.feature_weight, self.token_weight, self.ttt_steps, self.ttt_decay)

    def target_record(self) -> str | None:
        """What the card says the loss's target distribution was (None: the cached top-k's, or the argmax)."""
        return FULL_SOFTMAX_RECORD if self.full_softmax else None

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
