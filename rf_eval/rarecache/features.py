"""Cache entries as RaReCache's maps read and write them (paper section 3.1, appendix B.1).

A cache entry is one token's row vector over all KV heads of one layer,
d = n_kv * d_h. Keys are *de-rotated* (RoPE undone) before fitting and
mapping, and the target's predicted keys are *re-rotated* at their own
positions afterwards, so a map sees content without position. RoPE is a
rotation of each frequency pair by theta (times the model's
`attention_scaling`, 1 for plain RoPE); its inverse is the rotation by
-theta, i.e. the family's own `rotate` with sin negated, divided by the
squared scaling where that is not 1.

Only attention families are supported (Llama, Qwen3): a Gated DeltaNet
layer has no per-token cache entry to map.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine import new_cache
from rf_eval.families import (
    Family,
    attention_shape,
    family_class,
    family_class_for,
    family_for,
    registered_families,
    sliding_window,
)


def unsupported(config, role: str = "target") -> str | None:
    """Why RaReCache cannot map this model's cache (None: it can), from its config and family."""

    cls = family_class_for(config)
    if cls.linear_attention:
        attention_only = [name for name in registered_families() if not family_class(name).linear_attention]
        return (f"RaReCache maps KV caches; the {role} model ({config.model_type}) has Gated DeltaNet "
                f"layers, which hold no per-token cache entry. Use an attention-only family "
                f"({', '.join(attention_only)}).")
    if cls.rope_tables is not Family.rope_tables:
        return (f"RaReCache de-rotates keys with one RoPE table; the {role} model ({config.model_type}) "
                "rotates its layers with several")
    window = sliding_window(config)
    if window is not None:
        return (f"RaReCache maps whole KV caches; the {role} model's sliding-window layers keep only the last "
                f"{window - 1} rows in their cache. Use a checkpoint without a sliding window.")
    return None


def check_attention_only(model: nn.Module, role: str) -> Family:
    """The model's family; a clear error when RaReCache cannot map its cache (hybrids, sliding windows)."""
    family = family_for(model.config)
    reason = unsupported(model.config, role)
    if reason is not None:
        raise ValueError(reason)
    return family


def rope_tables(model: nn.Module, n: int, device, dtype: torch.dtype, start: int = 0):
    """The model's own RoPE tables (cos, sin), each (1, n, rope_dim), for positions start..start+n-1."""
    positions = torch.arange(start, start + n, device=device)[None]
    probe = torch.empty(1, dtype=dtype, device=device)
    return model.model.rotary_emb(probe, positions)


def _inverse_tables(model: nn.Module, cos: torch.Tensor, sin: torch.Tensor):
    scaling = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0) or 1.0)
    if scaling == 1.0:
        return cos, -sin
    return cos / scaling**2, -sin / scaling**2


def unrotate(model: nn.Module, family: Family, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Keys before RoPE from rotated keys (B, heads, n, D): rotation by -theta."""
    c, s = _inverse_tables(model, cos, sin)
    return family.rotate(keys, c, s)


def rows(x: torch.Tensor) -> torch.Tensor:
    """(1, heads, n, D) -> (n, heads*D): one cache entry per token, heads concatenated."""
    return x[0].transpose(0, 1).reshape(x.shape[2], -1)


def heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(n, heads*D) -> (1, heads, n, D), the inverse of `rows`."""
    return x.view(x.shape[0], n_heads, -1).transpose(0, 1)[None]


@torch.no_grad()
def prefill_cache(model: nn.Module, input_ids: torch.Tensor) -> DynamicCache:
    """The stock model's prompt cache (no logits): what a source model hands over in a cascade."""
    cache = new_cache(model)
    model.model(input_ids=input_ids, cache=cache, use_cache=True)
    return cache


def cache_entries(model: nn.Module, family: Family, cache: DynamicCache, n: int | None = None):
    """De-rotated keys and values of every layer, each a list of (n, n_kv*d_h) tensors.

    De-rotation happens here once per prompt and the blocks are shared by
    every target layer that reads them (appendix B.1).
    """
    first = cache.layers[0].keys
    n = first.shape[2] if n is None else n
    cos, sin = rope_tables(model, n, first.device, first.dtype)
    keys, values = [], []
    for layer in cache.layers:
        keys.append(rows(unrotate(model, family, layer.keys[:, :, :n], cos, sin)))
        values.append(rows(layer.values[:, :, :n]))
    return keys, values


def kv_shape(config) -> tuple[int, int]:
    """(n_kv heads, head dim) of a config."""
    _, kv_heads, head_dim = attention_shape(config)
    return kv_heads, head_dim
