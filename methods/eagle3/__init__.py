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
EAGLE-2's dynamic tree, built by methods/eagle/dynamic.py's Eagle2Drafter (total_token, depth, top_k; upstream's
EaModel defaults 60 / 7 / 10); only the head and its vocabulary differ.

Checkpoints: SafeAILab's (`yuhuili/EAGLE3-*`: config.json with `draft_vocab_size`, pytorch_model.bin or
model.safetensors) and the speculators format that vLLM loads (config.json with `speculators_model_type: eagle3`,
`architectures: ["Eagle3Speculator"]`, `transformer_layer_config`, weights with `layers.0.*` for `midlayer.*`), both
loaded strictly (checkpoints.py `load_eagle3`). `python -m bench.train method=eagle3` trains one (train.py
`Eagle3Recipe`, through methods/heads/training.py) and writes SafeAILab's layout; drafter.py drafts with it.
"""
