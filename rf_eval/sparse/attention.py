"""The block-sparse prefill attention, hooked in through `transformers`' attention interface.

`sparse_prefill(model, choose)` runs a forward of the model with its attention implementation set to
`IMPLEMENTATION` (registered once with `AttentionInterface`, its masks built as SDPA's), so every family
rf-eval serves runs it with no per-family code. In that forward, each attention call of a prompt's
prefill (as many queries as keys: an empty cache) asks `choose(layer, query, key)` for the layer's
pattern (`rf_eval.sparse.blocks`): None, or a pattern that keeps every causal block, runs the stock SDPA
call, bitwise; any other runs PyTorch's FlexAttention, compiled (`torch.compile`, dynamic shapes: one
compilation per model shape, not per length), over a `BlockMask` of the kept blocks, so the skipped blocks
are never computed. Every other call (a decoding step, a cache that holds rows) is the stock one: the
sparse pattern is the prefill's only. Inside, a block of arms sharing stock passes (`rf-eval demo`)
keeps and reads nothing (`rf_eval.engine.shared_rows.unshared`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rf_eval.engine.shared_rows import unshared
from rf_eval.sparse.blocks import block_mask, causal_blocks, keeps_every_block, with_diagonal

__all__ = ["IMPLEMENTATION", "Chooser", "attend_kept_blocks", "sparse_prefill", "warm"]

IMPLEMENTATION = "rf_eval_block_sparse"
#: (layer index, post-RoPE queries (1, H, n, D), keys (1, Hkv, n, D)) -> (pattern (H, blocks, blocks), block)
#: or None (the layer runs the stock attention)
Chooser = Callable[[int, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, int] | None"]

_choose: ContextVar[Chooser | None] = ContextVar("rf_eval_sparse_choose", default=None)


@functools.cache
def _flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def block_sparse_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention interface's function: the layer's pattern through FlexAttention in a prefill, else SDPA."""
    choose = _choose.get()
    chosen = None
    if choose is not None and query.shape[2] == key.shape[2] > 1 and kwargs.get("sliding_window") is None:
        chosen = choose(int(module.layer_idx), query, key)
    if chosen is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    keep, block = chosen
    n = query.shape[2]
    keep = with_diagonal(keep.to(query.device))
    if keeps_every_block(keep, n, block):  # every block kept: the stock call, bitwise
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if attention_mask is not None:
        raise RuntimeError("the block-sparse prefill reads one unpadded prompt (no attention mask); got a mask of "
                           f"shape {tuple(attention_mask.shape)}")
    # contiguous: one compiled kernel whatever layout a family's projections leave (`warm` compiles that one)
    out = _flex()(query.contiguous(), key.contiguous(), value.contiguous(), block_mask=block_mask(keep, n, block),
                  scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@torch.no_grad()  # as a prefill runs (grad mode is one of the compiled kernel's guards)
def warm(attn: torch.nn.Module, heads: int, kv_heads: int, dim: int, block: int) -> None:
    """Compile the kernel for this attention's shape, dtype and device now, so no prompt's timed prefill pays
    for it (the first call takes seconds; later lengths reuse it: `dynamic=True`)."""
    weight = next(attn.parameters())
    n = 2 * block + 1
    q, k, v = (torch.zeros(1, h, n, dim, dtype=weight.dtype, device=weight.device) for h in (heads, kv_heads, kv_heads))
    keep = causal_blocks(n, block, weight.device).expand(heads, -1, -1).clone()
    keep[:, -1, 0] = False
    _flex()(q, k, v, block_mask=block_mask(keep, n, block), scale=attn.scaling, enable_gqa=heads != kv_heads)


@functools.cache
def _register() -> None:
    AttentionInterface.register(IMPLEMENTATION, block_sparse_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


@contextmanager
def sparse_prefill(model: Any, choose: Chooser) -> Iterator[None]:
    """Inside: the model's attention asks `choose` for each layer's pattern of a prompt's prefill (see the
    module docstring); the model's own implementation is restored on the way out."""
    _register()
    before = model.config._attn_implementation
    token = _choose.set(choose)
    model.config._attn_implementation = IMPLEMENTATION
    try:
        with unshared():  # no stock pass or rows kept from this forward, none read into it
            yield
    finally:
        model.config._attn_implementation = before
        _choose.reset(token)


def attend_kept_blocks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
                       keep: torch.Tensor, block: int, scale: float) -> tuple[torch.Tensor, float]:
    """Causal attention of some of a prompt's rows (queries (1, H, m, D) at sorted `positions`) over every row's
    keys (1, Hkv, n, D), each query reading only the key blocks its own block keeps in `keep` (H, blocks,
    blocks; the diagonal always): a fill's exact rows in a late layer, whose other rows have no query. Per
    query block and head, one SDPA call over the gathered kept blocks, so the work follows the pattern.
    Returns ((1, m, H*D), the causal pairs computed, mean over heads)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    keep = with_diagonal(keep.to(query.device))
    out = query.new_empty(query.shape)
    offsets = torch.arange(block, device=query.device)
    owner = positions // block
    pairs = 0
    for b in torch.unique(owner).tolist():
        rows = (owner == b).nonzero().squeeze(1)
        at = positions[rows]
        for h in range(heads):
            keys_at = (keep[h, b].nonzero() * block + offsets).flatten()
            keys_at = keys_at[keys_at <= at[-1]]  # the diagonal block up to its last query; none past n
            visible = keys_at[None, :] <= at[:, None]
            pairs += int(visible.sum())
            kv = h * kv_heads // heads
            out[:, h, rows] = F.scaled_dot_product_attention(
                query[:, h : h + 1, rows], key[:, kv : kv + 1, keys_at], value[:, kv : kv + 1, keys_at],
                attn_mask=visible, scale=scale)[:, 0]
    return out.transpose(1, 2).reshape(1, query.shape[2], -1), pairs / heads
