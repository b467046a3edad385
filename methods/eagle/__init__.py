"""EAGLE (Li et al. 2024): a one-decoder-layer draft that autoregresses on the target's own features.

The head (head.py) maps (embedding of token t+1, target feature f_t) through fc: 2H -> H and one decoder layer of the
target's own architecture (built from its config class, first input norm skipped, no final norm) to a guess of
f_{t+1}; the target's LM head (or a draft-vocabulary slice of it) turns that into the next token's distribution.
Two drafters share it (drafter.py keeps its KV cache in step with the accepted context):
- EAGLE-1 (`method=eagle`, static.py): a static tree given as a choices list;
- EAGLE-2 (`method=eagle2`, dynamic.py): upstream's dynamic tree from the head's own confidence.
train.py is the training recipe (`python -m bench.train method=eagle`); checkpoints.py loads this project's heads and
SafeAILab's EAGLE-1/2 heads.
"""
