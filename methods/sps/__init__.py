"""SpS: speculative sampling with a separate draft model of the same tokenizer (Leviathan et al. 2023; Chen et al.
2023).

The draft model autoregresses a chain of γ tokens with its own KV cache; the shared engine verifies the chain in one
target forward and applies the shared acceptance rule (greedy match, or min(1, p/q) with residual resampling).
A draft is either any Hugging Face causal LM (e.g. `double7/vicuna-68m` for Vicuna) or a few of the target's own
layers distilled by `python -m bench.train method=sps`, stored without the embedding and LM head it shares with the
target (`slice_target`, `save_draft`, `load_draft`). Drafts load strictly: a tensor missing (which Hugging Face
would silently initialise at random), unexpected or of the wrong shape, or a weights file that cannot be read, is
refused in one line naming the draft and the fix.

draft.py makes, saves and loads drafts, drafter.py drafts with one, train.py trains one.
"""
