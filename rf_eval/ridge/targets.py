"""What a closed-form fit regresses each late layer's rows on: the layer's input, or its keys and values.

`inputs` (ridge, RidgeFill paper section 2.2): x_l, the hidden state entering
late layer l; the layer's own norm and projections then write its cache.
`kv` (kv_ridge, the K/V-projector design the paper's section 1 contrasts with):
the keys before RoPE (after k-norm) and the values of an attention layer, flattened
per row as [k heads x D, v heads x D]; the engine rotates the predicted keys at
their own positions. A Gated DeltaNet layer has no keys and values to cache: its
`kv` target is what its stock mixer reads, the normed input (d wide), from which
the mixer computes the filled rows' state update. RoPE rotates a key and its prediction alike, by an orthogonal
map, so the held-out cosine of section 2.2 is the same before or after it.
"""

from __future__ import annotations

import torch
from torch import nn

from rf_eval.families import Family, attention_shape

TARGETS = ("inputs", "kv")


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    return target


def kv_rows(family: Family, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An attention layer's pre-RoPE keys and values for input x (1, n, d), as (n, 2 * kv_heads * D)."""
    k, v = family.project_kv(layer.self_attn, family.input_norm(layer, x))
    n = x.shape[1]
    return torch.cat([k.transpose(1, 2).reshape(n, -1), v.transpose(1, 2).reshape(n, -1)], -1)


def target_rows(family: Family, layer: nn.Module, x: torch.Tensor, target: str) -> torch.Tensor:
    """What the fit regresses on for late layer `layer` with input x (1, n, d): (n, d_out)."""
    if target == "inputs":
        return x[0]
    return family.input_norm(layer, x)[0] if family.is_recurrent(layer) else kv_rows(family, layer, x)


def target_width(config, layer: int, target: str) -> int:
    """d_out of layer `layer`'s map for `target`: d, or for `kv` an attention layer's 2 x kv heads x D."""
    types = getattr(config, "layer_types", None)
    if target == "inputs" or (types is not None and types[layer] == "linear_attention"):
        return int(config.hidden_size)
    return kv_width(config)


def kv_width(config) -> int:
    """2 * kv_heads * head_dim of a model config (the width of a `kv` target)."""
    _, kv_heads, head_dim = attention_shape(config)
    return 2 * int(kv_heads) * int(head_dim)
