"""PARD's training layout (AMD's PARD, arXiv 2504.18583): one sequence of S tokens becomes K blocks that one draft
forward reads, block 0 the tokens themselves and block k (k >= 1) S copies of the mask token, where block k's
position p stands for the k-th mask after the prefix x_0..x_{p-k}.

Attention, as upstream's collator builds it: block k's position p sees the real tokens x_0..x_{p-k} and the masks
of blocks 1..k-1 at positions p-k+1..p-1 (the masks before it in the same draft), and itself; every block's
position ids run 0..S-1. The output at block k's position p predicts token p+1, i.e. the (k+1)-th token after the
prefix. Conditional drop-token (COD) keeps all of block 0 and, of block k, about S x max(r^k, r_min) positions
chosen at random among those whose block k-1 parent (position p-1) is kept, so that every kept mask's
predecessors are kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParallelLayout:
    """Which (block, position) pairs one training sequence keeps, flattened block by block."""

    block: torch.Tensor  # [N] int64: k, 0 for the real tokens
    position: torch.Tensor  # [N] int64: p, the position id

    def __len__(self) -> int:
        return len(self.block)

    def attention(self) -> torch.Tensor:
        """[N, N] bool, True where query i may attend key j (the module docstring's rule)."""
        qk, qp = self.block[:, None], self.position[:, None]
        kk, kp = self.block[None, :], self.position[None, :]
        real = (kk == 0) & (kp <= qp - qk)
        masks = (kk >= 1) & (kk <= qk) & (kp == qp - qk + kk)
        return real | masks

    def input_ids(self, ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
        """[B, S] token ids -> [B, N]: block 0's tokens, the mask token elsewhere."""
        out = ids[:, self.position]
        return torch.where(self.block[None, :] == 0, out, torch.full_like(out, mask_token_id))


def parallel_layout(seq_len: int, num_blocks: int, drop_ratio: float = 1.0, drop_ratio_min: float = 0.0,
                    generator: torch.Generator | None = None) -> ParallelLayout:
    """The kept positions of `num_blocks` blocks of `seq_len` under COD (drop_ratio 1: every position kept)."""
    blocks, positions = [torch.zeros(seq_len, dtype=torch.long)], [torch.arange(seq_len)]
    parents = torch.arange(seq_len)
    for k in range(1, num_blocks):
        candidates = parents[parents + 1 < seq_len] + 1  # position p needs its parent p-1 in block k-1
        candidates = candidates[candidates >= k]  # and a real prefix x_0..x_{p-k}
        keep = len(candidates) if drop_ratio >= 1 else int(seq_len * max(drop_ratio ** k, drop_ratio_min))
        if keep <= 0 or len(candidates) == 0:
            break
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:keep]].sort().values
        blocks.append(torch.full_like(chosen, k))
        positions.append(chosen)
        parents = chosen
    return ParallelLayout(torch.cat(blocks), torch.cat(positions))
