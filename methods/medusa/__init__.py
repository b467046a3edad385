"""Medusa-1 (Cai et al. 2024): K heads on the target's last hidden state draft a static token tree.

Head k (0-based) maps the target's post-norm hidden state h_t at the last accepted token to a guess of the token
k + 2 places ahead (the target's own LM head gives the next one, the tree's root). Each head is `num_layers`
ResBlocks followed by a vocabulary projection: by default the target's own LM head (Medusa's later "shared head"
choice, optionally a frequency-ranked slice of it), or one private projection per head as in the published
checkpoints. The candidates form a sparse tree given as a choices list (`[[0], [0, 0], [1], ...]`: a path of
top-k ranks, one per head), verified by the engine in one forward with tree attention; greedy and sampled
acceptance are the engine's lossless rules (the tree's siblings are deterministic proposals).

Checkpoints load from four formats: this project's (`python -m bench.train method=medusa`); FasterDecoding's
Medusa-1 (`config.json` with `medusa_num_heads` + `medusa_lm_head.pt`, keys `{head}.{layer}.linear.*` and
`{head}.{num_layers}.weight`); FasterDecoding's Medusa-2 (a full model folder, `config.json` with `medusa_num_heads`,
the same keys under `medusa_head.` inside model.safetensors / pytorch_model.bin or their index-listed shards; only
the head tensors are read, and since Medusa-2 also fine-tunes the base, the target must be that folder's own model);
and NVIDIA ModelOpt's (`mto.save` of a model converted with `mtsp.convert(model, [("medusa", ...)])`, see
modelopt.py). FasterDecoding's counts come from the weights, not config.json: the published Medusa-1 configs
declare fewer heads than medusa_lm_head.pt holds (upstream's loader overrides them); a disagreement is warned about
once. Upstream builds a head's ResBlocks as one module repeated (`[ResBlock] * num_layers`), so it applies the last
stored copy num_layers times; so do we. Loading is strict: a missing, unexpected or mis-shaped tensor, or an

heads.py holds the heads, train.py the recipe (`python -m bench.train method=medusa`), checkpoints.py the
loading, drafter.py the drafter, modelopt.py ModelOpt's training and checkpoints.
"""
