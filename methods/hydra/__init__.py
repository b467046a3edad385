"""Hydra (Ankner et al. 2024): Medusa heads made sequentially dependent.

Head k (0-based) guesses the token k + 2 places ahead, like Medusa's, but it also sees the embeddings of the tokens
before it on its tree path: its input is concat(h_t, e(root), e(x_1), ..., e(x_k)), (k + 2) x H wide, where h_t is
the target's feature at the last accepted token and x_1..x_k the draft tokens above it ("grounded" heads). A head
is a linear map of that input to H (initialised to pass h_t through), `num_layers` ResBlocks, then the target's LM
head (or its draft-vocabulary slice). The tree is Medusa's choices list, built level by level: one head call per
level for all the nodes whose children that level needs. Acceptance is the engine's lossless rule.

Hydra++ checkpoints as published (zankner/Hydra's `prefix-mlp` heads, e.g. ankner/hydra-vicuna-7b-v1.3) load as
`HydraPrefixHeads`: a one-decoder-layer "prefix" of the target's architecture (with its own norms and KV cache)
reads the target's features of the accepted context, and its output at the last one is the h_t the heads read;
head k is res(x) + SiLU(W x) on its (k + 2) x H input, then one ResBlock applied num_layers - 1 times (the same
block each time, as upstream builds it: its last stored copy is the one upstream's loading leaves), then the head's
own vocabulary projection (with a bias). Loading is strict: the only file keys dropped are the prefix's token
embedding (its inputs are features), the earlier copies of the shared block and rotary `inv_freq` buffers; anything
else missing, unexpected or mis-shaped, or an unreadable file, is refused in one line (InvalidArtifactError).

heads.py holds both kinds of heads, train.py the recipe (`python -m bench.train method=hydra`), checkpoints.py
the loading, drafter.py the drafter.
"""
