"""Block patterns of a sparse-attention prefill: which key blocks each query block computes, per head.

A pattern is a bool tensor `keep` (heads, blocks, blocks) over an n-row prompt cut into blocks of `block`
rows (the last one short when `block` does not divide n): `keep[h, i, j]` says query block i of head h
computes its scores against key block j. Only the causal triangle counts: blocks above the diagonal are
never computed, and every query block computes its own diagonal block (each row reads itself), whatever
a method asks. The one density convention (issue #56 item 5): the fraction of the causal triangle's
(query, key) pairs a head computes, `computed_pairs / causal_pairs(0, n)`; a method's published figure
in another convention (XAttention's and FlexPrefill's share of blocks) is converted to it where cited.

`block_mask` turns a pattern into FlexAttention's `BlockMask` from the kept block indices directly
(the diagonal blocks partial under the causal rule, the kept blocks below it full), so no score of a
skipped block is computed and no n x n mask is built.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

__all__ = ["block_count", "block_mask", "causal_blocks", "computed_pairs", "density", "with_diagonal"]


def block_count(n: int, block: int) -> int:
    return -(-n // block)


def causal_blocks(n: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(blocks, blocks) bool: the blocks on or below the diagonal, the most a pattern computes."""
    b = block_count(n, block)
    return torch.ones(b, b, dtype=torch.bool, device=device).tril()


def with_diagonal(keep: torch.Tensor) -> torch.Tensor:
    """`keep` within the causal triangle, with every diagonal block kept."""
    b = keep.shape[-1]
    eye = torch.eye(b, dtype=torch.bool, device=keep.device)
    return (keep | eye) & torch.ones_like(eye).tril()


def _block_rows(n: int, block: int, device: torch.device | str) -> torch.Tensor:
    """Rows in each block (the last one short)."""
    starts = torch.arange(0, n, block, device=device)
    return torch.clamp(n - starts, max=block)


def computed_pairs(keep: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """Per head, the causal (query, key) pairs inside the kept blocks (diagonal blocks counted as their causal
    half): what the attention computes, in pairs (heads,)."""
    keep = with_diagonal(keep)
    rows = _block_rows(n, block, keep.device).to(torch.float64)
    below = torch.outer(rows, rows).tril(-1)  # whole blocks under the diagonal
    diagonal = rows * (rows + 1) / 2
    return (keep.to(torch.float64) * below).sum((-1, -2)) + diagonal.sum()


def density(keep: torch.Tensor, n: int, block: int) -> float:
    """The fraction of the causal triangle's pairs computed, averaged over the heads."""
    return float(computed_pairs(keep, n, block).mean()) / (n * (n + 1) / 2)


def _causal(_b, _h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _indices(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) of the True blocks of each query block row, the indices first in ascending order (what
    `BlockMask.from_kv_blocks` reads; the rest of each row is ignored)."""
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True)
    return blocks.sum(-1).to(torch.int32)[None], order.to(torch.int32)[None]


def block_mask(keep: torch.Tensor, n: int, block: int) -> BlockMask:
    """FlexAttention's mask of pattern `keep` (heads, blocks, blocks) over an n-row prompt: the diagonal blocks
    under the causal rule, the kept blocks below the diagonal whole."""
    keep = with_diagonal(keep)
    diagonal = torch.eye(keep.shape[-1], dtype=torch.bool, device=keep.device).expand_as(keep)
    partial_count, partial = _indices(diagonal)
    full_count, full = _indices(keep & ~diagonal)
    return BlockMask.from_kv_blocks(partial_count, partial, full_count, full, BLOCK_SIZE=block, mask_mod=_causal,
                                    seq_lengths=(n, n))
