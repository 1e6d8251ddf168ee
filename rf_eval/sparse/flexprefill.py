"""FlexPrefill (Lai et al., ICLR 2025): per head, a query-aware or a vertical-slash block pattern.

The authors' rule (bytedance/FlexPrefill, `flex_prefill/ops/flex_prefill_attention.py`, `get_active_blocks`
and `flex_prefill_attention`), per layer and query head, from the last `block` queries (scaled by
1/sqrt(D)):
1. Their attention over every key (the last block causal among itself), softmax in fp32: the *vertical*
   distribution is its mean over those queries per key, the *slash* its mean along each diagonal (per
   distance between query and key).
2. The vertical and slash counts: the fewest entries whose sorted cumulative sum exceeds `gamma` (the
   count of those at most gamma, plus one), as blocks (count // block + 1; the authors' code divides by
   128, their only block), each clamped to [min, max] budget blocks.
3. Head choice (section 3.2): the mean last-block query against each key block's mean key, softmax over
   blocks, against the vertical distribution pooled to blocks; where the square-root Jensen-Shannon
   divergence is below `tau` the head is *query-aware* (both counts drop to the min budget), else
   *vertical-slash*.
4. Vertical-slash blocks: the top key blocks of the pooled vertical distribution (the first always) in
   every query block at or after them, and the top diagonals of the pooled slash distribution (the main
   diagonal always).
5. Query-aware heads add, from each query block's mean query against each key block's mean key (causal,
   softmax per query block), the blocks of the largest scores whose cumulative sum over the whole
   (query block, key block) table stays within gamma times the number of query blocks, and block (0, 0).
A prompt of at most max(2 blocks, the min budget) runs dense, as theirs. Defaults are their README's:
gamma 0.9, tau 0.1, min budget 512 tokens, no max. Charged per layer: the last block's scores (block x N x
D per head), the pooled scores (blocks x D per head), and each query-aware head's blocks x blocks x D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_eval.fields import ArmError
from rf_eval.methods.base import PromptPlan
from rf_eval.sparse.blocks import block_count, block_rows, causal_blocks
from rf_eval.sparse.method import Choice, SparseArm, SparsePrefill

__all__ = ["FlexPrefill", "active_blocks"]


def cover_count(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """Entries of `x` (last dim, descending) whose cumulative sum is at most gamma, plus one."""
    return (x.sort(-1, descending=True).values.cumsum(-1) <= gamma).sum(-1) + 1


def block_sums(x: torch.Tensor, block: int) -> torch.Tensor:
    """Sums of `x` over blocks of its last dim (the last one short)."""
    n = x.shape[-1]
    return F.pad(x, (0, block_count(n, block) * block - n)).unflatten(-1, (-1, block)).sum(-1)


def block_means(x: torch.Tensor, block: int) -> torch.Tensor:
    """Means of `x` (H, n, D) over blocks of rows, over the rows a block holds (H, blocks, D)."""
    n = x.shape[1]
    sums = F.pad(x, (0, 0, 0, block_count(n, block) * block - n)).unflatten(1, (-1, block)).sum(2)
    return sums / block_rows(n, block, x.device)[None, :, None]


def sqrt_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    m = (p + q) / 2
    return torch.sqrt(0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1))


def diagonal_means(probs: torch.Tensor) -> torch.Tensor:
    """(H, N): the mean over the last-block rows of the entries at each distance from the main diagonal;
    index N - 1 is distance 0 (the authors' `sum_all_diagonal_matrix` order)."""
    heads, rows, n = probs.shape
    out = torch.zeros(heads, n, dtype=probs.dtype, device=probs.device)
    for r in range(rows):  # row r sits at position n - rows + r; its entry at distance t is column n - rows + r - t
        distance = (n - rows + r) - torch.arange(n - rows + r + 1, device=probs.device)
        out.index_add_(1, n - 1 - distance, probs[:, r, : n - rows + r + 1])
    return out / rows


def active_blocks(query: torch.Tensor, key: torch.Tensor, block: int, gamma: float, tau: float,
                  min_blocks: int, max_blocks: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Steps 1-5 for one layer: (kept blocks (H, blocks, blocks), query-aware heads, each block's estimated
    attention (H, blocks, blocks): its key block's vertical mass plus its diagonal's slash mass, or a
    query-aware head's pooled score; what a budget ranks the blocks by)."""
    heads, n, dim = query.shape[1], query.shape[2], query.shape[3]
    key = key[0].repeat_interleave(heads // key.shape[1], 0).float()
    blocks = block_count(n, block)
    max_blocks = min(max_blocks, blocks)
    last = query[0, :, -block:].float() / math.sqrt(dim)  # (H, block, D)
    scores = last @ key.transpose(-1, -2)
    rows = torch.arange(block, device=scores.device)
    scores[:, :, -block:] = scores[:, :, -block:].masked_fill(rows[None, :] > rows[:, None], float("-inf"))
    probs = scores.softmax(-1)
    vertical, slash = probs.mean(1), diagonal_means(probs)
    counts_v = (cover_count(vertical, gamma) // block + 1).clamp(min_blocks, max_blocks)
    counts_s = (cover_count(slash, gamma) // block + 1).clamp(min_blocks, max_blocks)
    vertical, slash = block_sums(vertical, block), block_sums(slash, block)
    mean_keys = block_means(key, block)  # (H, blocks, D)
    estimate = ((last.mean(1, keepdim=True) @ mean_keys.transpose(-1, -2))[:, 0]).softmax(-1)
    aware = sqrt_js(estimate, vertical) < tau
    counts_v[aware] = min_blocks
    counts_s[aware] = min_blocks
    rank = torch.arange(blocks, device=scores.device)
    i, j = rank[:, None], rank[None, :]
    offsets = ((blocks - 1) - (i - j)).clamp(0, blocks - 1).expand(heads, -1, -1).flatten(1)
    priority = vertical[:, None, :] + slash.gather(-1, offsets).view(heads, blocks, blocks)
    vertical[:, 0] = slash[:, -1] = float("inf")  # the first key block, the main diagonal
    top_v = vertical.argsort(dim=-1, descending=True, stable=True)
    top_s = slash.argsort(dim=-1, descending=True, stable=True)
    columns = torch.zeros(heads, blocks, dtype=torch.bool, device=scores.device).scatter(
        -1, top_v, rank[None] < counts_v[:, None])
    distances = torch.zeros_like(columns).scatter(-1, (blocks - 1) - top_s, rank[None] < counts_s[:, None])
    keep = columns[:, None, :] | distances.gather(-1, (i - j).clamp(min=0).expand(heads, -1, -1).flatten(1)
                                                  ).view(heads, blocks, blocks)
    keep &= causal_blocks(n, block, keep.device)
    for h in aware.nonzero().flatten().tolist():
        means = block_means(query[0, h : h + 1].float(), block)[0] / math.sqrt(dim)
        table = (means @ mean_keys[h].T).masked_fill(~causal_blocks(n, block, keep.device), float("-inf"))
        probs = table.softmax(-1)
        ordered, order = probs.flatten().sort(descending=True)
        chosen = order[ordered.cumsum(0) <= gamma * blocks]
        keep[h].view(-1)[chosen] = True
        keep[h, 0, 0] = True
        priority[h] = probs
    return keep, int(aware.sum()), priority


class FlexPrefill(SparsePrefill):
    """FlexPrefill's block choice in every full-attention layer; see the module docstring."""

    name = "flexprefill"

    @dataclass(frozen=True, kw_only=True)
    class Arm(SparseArm):
        """`gamma` (0.9): the attention mass the chosen blocks cover; `tau` (0.1): the divergence below which a
        head is query-aware; `min_budget` (512) and `max_budget` (none): tokens, rounded up to blocks."""

        gamma: float = 0.9
        tau: float = 0.1
        min_budget: int = 512
        max_budget: int | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            if not 0 < self.gamma <= 1:
                raise ArmError(f"gamma={self.gamma!r} is a share of the attention; give 0 < gamma <= 1")
            if not 0 <= self.tau <= 1:
                raise ArmError(f"tau={self.tau!r} bounds a square-root Jensen-Shannon divergence; give "
                               "0 <= tau <= 1")
            if self.min_budget < 1 or (self.max_budget is not None and self.max_budget < self.min_budget):
                raise ArmError(f"min_budget={self.min_budget}, max_budget={self.max_budget}: give 1 <= min_budget "
                               "<= max_budget (tokens)")

    def dense(self, n: int) -> bool:
        """A prompt of at most max(2 blocks, the min budget) runs dense, as the authors'."""
        block = self.arm.block
        return n <= max(2 * block, -(-self.arm.min_budget // block) * block)

    def estimate_macs(self, n: int, aware: int | None = None) -> int:
        heads, _, dim = self.shape
        blocks = block_count(n, self.arm.block)
        aware = heads if aware is None else aware
        return heads * (self.arm.block * n + blocks) * dim + aware * blocks * blocks * dim

    def pattern(self, layer: int, query: torch.Tensor, key: torch.Tensor, plan: PromptPlan) -> Choice:
        block, n = self.arm.block, query.shape[2]
        most = block_count(n, block) if self.arm.max_budget is None else -(-self.arm.max_budget // block)
        keep, aware, scores = active_blocks(query, key, block, self.arm.gamma, self.arm.tau,
                                            -(-self.arm.min_budget // block), most)
        return Choice(keep, self.estimate_macs(n, aware), scores)
