"""XAttention (Xu et al., 2025): blocks chosen by antidiagonal scoring.

The authors' rule (mit-han-lab/x-attention, `xattn/src/Xattention.py`, `xattn_estimate` in its "inverse"
mode, and `utils.find_blocks_chunked`, causal prefill), per layer and query head:
1. Cut queries and keys into rows of `stride` S. A reshaped query row r holds the queries S r + S - 1,
   ..., S r (reversed), a reshaped key row c the keys S c, ..., S c + S - 1, so their dot product sums one
   antidiagonal of the S x S block: sum_t q[S r + S - 1 - t] . k[S c + t].
2. Scale by 1 / (sqrt(D) S), mask c > r (causal at stride level), softmax over c (fp32).
3. Sum the probabilities over each (block / S) x (block / S) tile: a block score per (query block, key
   block).
4. Per query block, keep the first key block (the sink) and its diagonal block, then the other blocks in
   descending score while the kept blocks' sum stays below `threshold` times the row's sum (so the block
   that reaches it is kept too): the fewest key blocks reaching the threshold.
Their LLM defaults are stride 16 and block 128; the threshold is 0.9 here, one value for every head (their
Llama-3.1-8B runs read per-head thresholds tuned for that model, `llama_fuse_16`, which no other model has;
`FastPrefillConfig(threshold=...)` is their constant). Prompt rows past the last whole stride are zero-padded
and padded key columns masked, as theirs. The estimation pass is charged its antidiagonal matmul: S D MACs
per causal pair of reshaped rows, per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_eval.cost.mac_model import causal_pairs
from rf_eval.fields import ArmError
from rf_eval.methods.base import PromptPlan
from rf_eval.sparse.blocks import block_count
from rf_eval.sparse.method import Choice, SparseArm, SparsePrefill

__all__ = ["XAttention", "block_scores", "fewest_blocks"]


def block_scores(query: torch.Tensor, key: torch.Tensor, stride: int, block: int) -> torch.Tensor:
    """Steps 1-3: (heads, blocks, blocks) sums of the stride-level antidiagonal softmax; keys shared by each
    group of query heads."""
    heads, n, dim = query.shape[1], query.shape[2], query.shape[3]
    key = key.repeat_interleave(heads // key.shape[1], 1)
    blocks = block_count(n, block)
    rows = blocks * (block // stride)  # reshaped rows, the last blocks' padding included
    pad = rows * stride - n
    q, k = (F.pad(x[0].float(), (0, 0, 0, pad)) for x in (query, key))
    folded_q = torch.cat([q[:, stride - 1 - t :: stride] for t in range(stride)], -1)  # (H, rows, S D)
    folded_k = torch.cat([k[:, t::stride] for t in range(stride)], -1)
    scores = folded_q @ folded_k.transpose(-1, -2) / (math.sqrt(dim) * stride)
    valid = -(-n // stride)  # reshaped rows holding a prompt row
    r = torch.arange(rows, device=scores.device)
    scores = scores.masked_fill((r[None, :] > r[:, None]) | (r[None, :] >= valid), float("-inf"))
    probs = scores.softmax(-1)
    probs[:, valid:] = 0  # padded query rows count nothing
    tile = block // stride
    return probs.view(heads, blocks, tile, blocks, tile).sum((2, 4))


def fewest_blocks(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Step 4: (heads, blocks, blocks) kept: the sink and the diagonal, then the others by descending score
    while the kept sum is below `threshold` times the row's sum; within the causal triangle."""
    heads, blocks, _ = scores.shape
    scores = scores.double()
    eye = torch.eye(blocks, dtype=torch.bool, device=scores.device)
    forced = eye.clone()
    forced[:, 0] = True
    forced = forced.expand(heads, blocks, blocks)
    required = scores.sum(-1, keepdim=True) * threshold
    others = scores.masked_fill(forced, float("-inf"))
    ordered, order = others.sort(-1, descending=True)
    gained = ordered.clamp(min=0)
    before = scores.masked_fill(~forced, 0).sum(-1, keepdim=True) + gained.cumsum(-1) - gained  # sum kept so far
    chosen = torch.zeros(heads, blocks, blocks, dtype=torch.bool, device=scores.device).scatter(
        -1, order, (before < required) & ordered.isfinite())
    return (forced | chosen) & torch.ones_like(eye).tril()


class XAttention(SparsePrefill):
    """XAttention's block choice in every full-attention layer; see the module docstring."""

    name = "xattention"

    @dataclass(frozen=True, kw_only=True)
    class Arm(SparseArm):
        """`threshold` of each query block's estimated attention its key blocks reach (0.9), `stride` of the
        antidiagonals (16); `budget` caps the blocks, the lowest block scores cut first."""

        threshold: float = 0.9
        stride: int = 16

        def __post_init__(self) -> None:
            super().__post_init__()
            if not 0 < self.threshold <= 1:
                raise ArmError(f"threshold={self.threshold!r} is a share of each query block's attention; give "
                               "0 < threshold <= 1")
            if self.stride < 1 or self.block % self.stride:
                raise ArmError(f"stride={self.stride}: give a stride >= 1 that divides block={self.block} (a block "
                               "holds whole antidiagonals)")

    def estimate_macs(self, n: int) -> int:
        heads, _, dim = self.shape
        return heads * causal_pairs(0, -(-n // self.arm.stride)) * self.arm.stride * dim

    def pattern(self, layer: int, query: torch.Tensor, key: torch.Tensor, plan: PromptPlan) -> Choice:
        scores = block_scores(query, key, self.arm.stride, self.arm.block)
        return Choice(fewest_blocks(scores, self.arm.threshold), self.estimate_macs(query.shape[2]), scores)
