"""Causal attention of a late layer's exact rows over the keys its cache holds."""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def visible_keys(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The causal rule, (queries, keys) bool: a query at position i reads the key at j when j <= i and,
    on a sliding-window layer, i - window < j (as `transformers` masks it). The engine's attention and the
    selectors' attention scores both read it."""
    k_pos, q_pos = k_pos[None, :], q_pos[:, None].to(k_pos.device)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    masking: QueryChunks | None = None,
) -> torch.Tensor:
    """Causal attention of queries at positions q_pos over keys at k_pos -> (B, n, heads*D).

    `masking` (its `window` and `sinks`; None: neither). `window`: a sliding-window layer's, as `transformers` masks it: a query at
    position i reads keys at positions j with i - window < j <= i. `sinks`:
    per-head attention-sink logits (GPT-OSS), one more softmax column that
    takes weight and gives no value: a zero key and value whose mask entry is
    the head's sink logit.
    """
    window, sinks = (None, None) if masking is None else (masking.window, masking.sinks)
    mask = visible_keys(q_pos, k_pos, window)
    if sinks is not None:
        k = torch.cat([k, k.new_zeros((*k.shape[:2], 1, k.shape[-1]))], 2)
        v = torch.cat([v, v.new_zeros((*v.shape[:2], 1, v.shape[-1]))], 2)
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        sink = sinks.to(q.dtype).view(1, -1, 1, 1).expand(1, q.shape[1], mask.shape[0], 1)
        mask = torch.cat([bias[None, None].expand(1, q.shape[1], -1, -1), sink], -1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def stock_mask(config, x: torch.Tensor, sliding: bool = False) -> torch.Tensor | None:
    """The causal mask the stock model builds for an n-row prompt with no padding (x: (1, n, d)); `sliding`:
    the one its sliding-window layers read.

    None where the attention implementation relies on `is_causal` (SDPA).
    """
    positions = torch.arange(x.shape[1], device=x.device)[None]
    build = create_sliding_window_causal_mask if sliding else create_causal_mask
    return build(config=config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=positions)


def attend_like_stock(
    attn: nn.Module, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
    extra: dict | None = None,
) -> torch.Tensor:
    """Attention of every prompt row over every prompt row, as the stock layer computes it -> (B, n, heads*D).

    The model's own attention function (its `_attn_implementation`) with the
    stock mask (`stock_mask`): the same kernel and reduction order as the
    unmodified layer, so a late layer whose rows are all exact is bitwise the
    stock one (the engine floor, RidgeFill paper sections 4.3 and 9, step 4).
    """
    eager = sys.modules[type(attn).__module__].eager_attention_forward  # the stock layer's default
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)
    out, _ = interface(attn, q, keys, values, mask, dropout=0.0, scaling=attn.scaling, **(extra or {}))
    return out.reshape(q.shape[0], q.shape[2], -1).contiguous()


#: Queries per attention call for exact rows inside the prefix (selected rows).
PREFIX_QUERY_CHUNK = 64


class QueryChunks(NamedTuple):
    """How `attend_exact_rows` splits its queries: tail rows `query_chunk` at a time, from `prefix_end` on.

    `window` and `sinks`: how the layer masks (its sliding window, None for
    full causal attention) and its per-head attention-sink logits (None: none).
    """

    query_chunk: int
    prefix_end: int
    window: int | None = None
    sinks: torch.Tensor | None = None


def attend_exact_rows(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    chunks: QueryChunks,
) -> torch.Tensor:
    """Causal attention of the exact rows (sorted positions q_pos) over the cache's keys (sorted k_pos).

    `chunks`: see `QueryChunks`. A masked SDPA call computes scores
    against every key it is given, so a selected row early in the prompt would
    pay for the whole context. Rows before `prefix_end` therefore go in small
    chunks, each given only the keys up to its last query's position: the work
    follows the causal triangle, as the cost model charges it (paper section
    4.4 on scattered exact rows). Rows from `prefix_end` on (the tail) go in
    chunks of `query_chunk` over every key, as before. Dropping keys that every
    query in a chunk masks out changes nothing but the summation's length.
    """
    query_chunk, prefix_end, window, _ = chunks
    n_q = q.shape[2]
    n_prefix = int(torch.searchsorted(q_pos, prefix_end).item()) if n_q else 0
    bounds = [(i, min(i + PREFIX_QUERY_CHUNK, n_prefix)) for i in range(0, n_prefix, PREFIX_QUERY_CHUNK)]
    bounds += [(i, min(i + query_chunk, n_q)) for i in range(n_prefix, n_q, query_chunk)]
    if not bounds:
        return q.new_empty((q.shape[0], 0, q.shape[1] * values.shape[-1]))
    last_pos = q_pos[torch.tensor([stop - 1 for _, stop in bounds], device=q_pos.device)]
    key_ends = torch.searchsorted(k_pos, last_pos, right=True).tolist()
    key_starts = [0] * len(bounds)
    if window is not None:  # a windowed chunk needs no key before its first query's window
        first_pos = q_pos[torch.tensor([start for start, _ in bounds], device=q_pos.device)]
        key_starts = torch.searchsorted(k_pos, first_pos - window + 1).tolist()
    pieces = []
    for (start, stop), begin, end in zip(bounds, key_starts, key_ends):
        if start >= n_prefix:
            end = k_pos.numel()  # tail chunks: every key up to the end (the mask does the rest), as the plain path
        keys_at = slice(begin, end)
        pieces.append(
            _attend(q[:, :, start:stop], keys[:, :, keys_at], values[:, :, keys_at], q_pos[start:stop],
                    k_pos[keys_at], scale, chunks)
        )
    return torch.cat(pieces, 1)
