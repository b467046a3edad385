"""EAGLE-3's drafter (`method=eagle3`): EAGLE-2's dynamic tree over an EAGLE-3 head."""
from __future__ import annotations

import torch

from bench.engine.sampling import SamplingConfig
from methods.eagle.dynamic import Eagle2Drafter
from methods.eagle3.checkpoints import load_eagle3
from methods.eagle3.head import Eagle3Head, Eagle3Vocabulary, eagle3_feature_layers, layer_config


class Eagle3Drafter(Eagle2Drafter):
    """EAGLE-2's dynamic tree (Eagle2Drafter's, upstream's `topK_genrate`) over an EAGLE-3 head: the target's three
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


def tiny_drafter(target, sampling: SamplingConfig, knobs: dict, tmp_path) -> Eagle3Drafter:
    """For the tests: this drafter at `knobs`' tree over a random head for a tiny target, its draft vocabulary 12 of
    the target's ids (a non-trivial d2t; tests/test_sampling_methods.py)."""
    head = random_head(target, 2, draft_vocab=12, std=0.3)
    return Eagle3Drafter(target, head=head, total_token=knobs["total_token"], depth=knobs["depth"],
                         top_k=knobs["top_k"], sampling=sampling, seed=0)


def random_head(target, seed: int, draft_vocab: int, std: float | None = None) -> Eagle3Head:
    """A random head for `target` whose draft vocabulary is a random subset of `draft_vocab` target ids (so d2t is
    not constant); std: every weight N(0, std) (norms included), else the modules' own initialisation."""
    config = target.config
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = Eagle3Head(layer_config(config.to_dict()), config.hidden_size, config.vocab_size, draft_vocab,
                      eagle3_feature_layers(config.num_hidden_layers))
    if std is not None:
        for p in head.parameters():
            torch.nn.init.normal_(p, std=std, generator=generator)
    ids = torch.randperm(config.vocab_size, generator=generator)[:draft_vocab].sort().values
    head.d2t.copy_(ids - torch.arange(draft_vocab))
    head.t2d.zero_()[ids] = True
    return head.to(target.dtype).eval()
