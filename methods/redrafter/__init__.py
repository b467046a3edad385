"""Apple's Recurrent Drafter (Cheng et al. 2024, "Recurrent Drafter for Fast Speculative Decoding in Large Language
Models", arXiv 2403.09919), as apple/ml-recurrent-drafter's PyTorch code drafts.

An RNN whose state starts at zero and advances on each drafted token's embedding (the target's own embedding table)
reads, beside it, the target's last hidden state h at the last accepted token; ResBlocks and an LM head turn [h, s]
into the next token's distribution (head.py has the equations). Drafting is upstream's beam search
(`beam_width` beams of `beam_length` tokens, the first the token the target chose), the beams deduplicated into one
prefix tree (upstream's dynamic tree attention) and verified together (drafter.py). Proposals are deterministic;
greedy and sampled acceptance are the engine's lossless rules.

Checkpoints load from two layouts (checkpoints.py), strictly (a missing, unexpected or mis-shaped tensor, a config
that does not describe a recurrent drafter, or one made for another hidden size or vocabulary is refused in one
line): upstream's (`save_pretrained` of its `Drafter`: config.json with model_type recurrent_drafting_drafter and
DrafterConfig's vocab_size, hidden_size, exit_dim, num_draft_layers, rnn; tensors `input_proj`, `lm_head.{i}.linear`,
`lm_head.{L}`, `rnn_u`, `rnn_w`), and this project's (`python -m bench.train method=redrafter`, train.py, upstream's
drafter loss), whose LM head projects into the target's own LM head instead of a vocabulary-sized table.
"""
