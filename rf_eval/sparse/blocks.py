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

__all__ = ["block_count", "block_mask", "block_pairs", "block_rows", "causal_blocks", "computed_pairs", "density", "forced_blocks",
           "keeps_every_block", "with_diagonal", "within_pairs"]


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


def keeps_every_block(keep: torch.Tensor, n: int, block: int) -> bool:
    """Whether pattern `keep` computes the whole causal triangle of an n-row prompt (the stock attention's)."""
    return bool(with_diagonal(keep).eq(causal_blocks(n, block, keep.device)).all())


def block_rows(n: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows in each block (the last one short)."""
    starts = torch.arange(0, n, block, device=device)
    return torch.clamp(n - starts, max=block)


def block_pairs(n: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(blocks, blocks) float64: the causal pairs each block holds (whole below the diagonal, the causal half
    on it, none above)."""
    rows = block_rows(n, block, device).to(torch.float64)
    return torch.outer(rows, rows).tril(-1) + torch.diag(rows * (rows + 1) / 2)


def computed_pairs(keep: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """Per head, the causal (query, key) pairs inside the kept blocks (diagonal blocks counted as their causal
    half): what the attention computes, in pairs (heads,)."""
    return (with_diagonal(keep).to(torch.float64) * block_pairs(n, block, keep.device)).sum((-1, -2))


def forced_blocks(blocks: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(blocks, blocks): the first key block and the diagonal, which every adaptive rule keeps."""
    forced = torch.eye(blocks, dtype=torch.bool, device=device)
    forced[:, 0] = True
    return forced


def within_pairs(keep: torch.Tensor, priority: torch.Tensor, n: int, block: int, cap: float) -> torch.Tensor:
    """`keep` cut, per head, to at most `cap` causal pairs (a budget's share): the forced blocks, then the
    other kept blocks by descending `priority` (the rule's own block scores) while their pairs fit."""
    keep = with_diagonal(keep)
    heads, blocks, _ = keep.shape
    forced = forced_blocks(blocks, keep.device) & causal_blocks(n, block, keep.device)
    sizes = block_pairs(n, block, keep.device)
    others = keep & ~forced
    ranked, order = priority.double().masked_fill(~others, float("-inf")).flatten(1).sort(-1, descending=True)
    spent = (forced * sizes).sum() + (sizes.flatten()[order] * ranked.isfinite()).cumsum(-1)
    taken = torch.zeros(heads, blocks * blocks, dtype=torch.bool, device=keep.device).scatter(
        -1, order, ranked.isfinite() & (spent <= cap))
    return forced.expand_as(keep) | taken.view(heads, blocks, blocks)


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
