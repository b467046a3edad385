"""IBM's MLPSpeculator (Wertheimer et al. 2024, "Accelerating Production LLMs with Combined Token/Embedding
Speculators", arXiv 2404.19124): `n_predict` stages on the target's last hidden state, each conditioned on the token
drafted before it, as fms-extras' `MLPSpeculator` and vLLM's and TGI's `mlp_speculator` run it.

Stage i mixes the running state (at first the target's feature h_t at the last accepted token) with the embedding of
the token before the one it guesses, normalises, applies GELU and scores through its own head (head.py has the
equations). Drafting is fms-extras' `generate_suffixes`: every candidate keeps its `top_k_tokens_per_head[i]` best
tokens at stage i, and the `n_candidates` best sequences by summed log-probability are verified as one tree with
their shared prefixes merged (drafter.py). Proposals are deterministic; greedy and sampled acceptance are the engine's
lossless rules.

Checkpoints load from three layouts (checkpoints.py), strictly (a missing, unexpected or mis-shaped tensor, a config
that does not describe an MLPSpeculator, or one made for another hidden size or vocabulary is refused in one line):
IBM's accelerator folders (config.json with `architectures: [MLPSpeculatorPreTrainedModel]`, tensors `emb.{i}`,
`proj.{i}`, `head.{i}`, `ln.{i}` as vLLM reads them, optionally `speculator.`-prefixed, with the `tie_weights` and
`scale_input` variants), the `speculators` package's `mlp` layout (`emb_layers`, `proj_layers`, `layernorms` (torch
LayerNorms), `head`; only with `inputs_hidden_states_normalized: true`, since the engine hands drafters the
normalised state), and this project's (`python -m bench.train method=mlp_speculator`, train.py), whose CPU-sized
stages read the target's own embedding and LM head through private linear maps instead of two vocabulary-sized
tables per stage.
"""
