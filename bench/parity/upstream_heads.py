"""Our trained heads in the layouts the upstream packages load (for the medusa, eagle and samd parity files), with
the draft-vocabulary ids beside them: ours project onto a slice of the target's LM head, upstream's onto all of it,
so the upstream side (sides/upstream_driver.py) scores them through the full LM head plus a bias of 0 on the slice
and -1e9 elsewhere."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.parity.environments import rope_theta
from methods.eagle.checkpoints import load_eagle
from methods.medusa.checkpoints import load_medusa


def slice_bias(vocab, vocab_size: int) -> torch.Tensor:
    """0 on the draft-vocabulary slice, -1e9 elsewhere: full-vocabulary logits that rank only the slice."""
    bias = torch.full((vocab_size,), -1e9)
    bias[vocab.token_ids.cpu()] = 0.0
    return bias


def medusa_heads(checkpoint: str, target, out: Path) -> Path:
    """Our Medusa heads in FasterDecoding's layout: `{head}.{layer}.linear.*` ResBlocks and `{head}.{layers}` the
    vocabulary projection, here the target's full LM head plus slice_bias (medusa's own projection has no bias)."""
    heads, vocab, _ = load_medusa(checkpoint, target)
    layers = len(heads.blocks[0])
    lm_head = target.get_output_embeddings().weight.detach().cpu()
    state = {f"{h}.{rest}": v.detach().cpu() for h in range(heads.num_heads)
             for rest, v in heads.blocks[h].state_dict().items()}
    for h in range(heads.num_heads):
        state[f"{h}.{layers}.weight"] = lm_head
        state[f"{h}.{layers}.bias"] = slice_bias(vocab, lm_head.shape[0])
    out.mkdir(parents=True)
    torch.save(state, out / "medusa_lm_head.pt")
    torch.save(vocab.token_ids.cpu(), out / "draft_vocab_ids.pt")
    (out / "config.json").write_text(json.dumps({"medusa_num_heads": heads.num_heads, "medusa_num_layers": layers}))
    return out


def eagle_head(checkpoint: str, target, out: Path) -> Path:
    """Our EAGLE head in SafeAILab's layout (config.json + pytorch_model.bin: embed_tokens, fc, layers.0 without
    input_layernorm); the driver hands its draft the sliced LM head."""
    head, vocab, _ = load_eagle(checkpoint, target)
    state = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().cpu()}
    for key, value in head.state_dict().items():
        if key.startswith("fc."):
            state[key] = value.detach().cpu()
        elif key.startswith("body.layers.0."):
            state[key.removeprefix("body.")] = value.detach().cpu()
    c = target.config
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True,
              "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "hidden_act": c.hidden_act,
              "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
              "pad_token_id": c.pad_token_id, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
              "rope_theta": rope_theta(c), "rope_scaling": None, "tie_word_embeddings": False}
    out.mkdir(parents=True)
    torch.save(state, out / "pytorch_model.bin")
    torch.save(vocab.token_ids.cpu(), out / "draft_vocab_ids.pt")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
