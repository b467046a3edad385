"""Turning logits into token choices: the processing shared by vanilla and every speculative method."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters (applied in transformers' order)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, as `generate(do_sample=True)` computes them.

    logits: [..., vocab] -> [..., vocab] float32.
    """
    logits = logits.float() / cfg.temperature
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= 1 - cfg.top_p
        remove_sorted[..., -1:] = False  # always keep the most likely token
        logits = logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a [vocab] distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last (vocabulary) dimension, taken in float32: exact (bfloat16 widens without rounding,
    and a tie still goes to the first index), and on CPU 4-6x faster than torch's bfloat16 argmax (7 rows of
    SmolLM2's 49,152 logits: 0.12 ms against 0.64 ms, a fiftieth of a verification step)."""
    return logits.float().argmax(-1)


def pick_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> int:
    """The target's next token from its logits [vocab]: the argmax under greedy decoding, else a sample."""
    if sampling.greedy:
        return int(greedy_tokens(logits))
    return sample(logits_to_probs(logits, sampling).cpu(), generator)
