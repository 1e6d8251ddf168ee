"""Compute model for RidgeFill prefill (paper section 2.5).

`ceiling_r` is the layer-pass count: the share of exact prefill's layer
passes that remain, r = S/L + (1 - S/L) T/N; the speedup is at most 1/r.

`prefill_macs` is the multiply-accumulate count the paper uses for
comparisons that are close: every layer each row runs, attention over the
causal context included, plus the maps (d_in * d_out per filled row per
layer). What a filled row costs in a late layer is what the engine computes
for it: K/V projections in an attention layer; the state-update side of a
Gated DeltaNet layer (input projections, short convolution, recurrent
update); nothing in `nofill`. Maps are charged where they are used: from
layer S+1 by default (layer S reads x_S, `DEFAULT_MAP_SPLIT`); with
`map_split` (the paper's released maps and its MAC counts: section 2.2 "Size
and cost", section 2.5) layer S's filled rows read A_S x_S + b_S, so maps are
charged at layers S..L-1. Selected exact prefix rows are
charged attention at the mean prefix position, (N - T) / 2.

A sliding-window layer (`LayerCost.window`) charges each query at most
`window` keys: what its mask leaves (filled rows still pay their K/V).

What a layer holds is read from the model's family (`rf_eval.families`):
its `gated_attention`, `moe_mlp` and `linear_attention` facts say which
config fields describe the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from rf_eval.cost.budget import largest_within
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT, check_split
from rf_eval.families import attention_shape, family_class_for
from rf_eval.fills import FILL_OFF, Fill, fill_named
from rf_eval.fills.nofill import NoFill


def ceiling_r(L: int, S: int, T: int, N: int) -> float:
    """Share of exact prefill's layer passes that remain (section 2.5); 1/r is the speedup ceiling."""
    if not 0 <= S <= L or N <= 0:
        raise ValueError(f"need 0 <= S <= L and N > 0; got L={L}, S={S}, N={N}")
    T = min(max(T, 0), N)
    return (S * (N - T) + L * T) / (L * N)


@dataclass(frozen=True)
class LayerCost:
    """MACs per row of one layer, split into what filled rows still pay and the rest."""

    kind: str  # "attention" or "recurrent"
    write: int  # per row: what a filled row computes (K/V, or the state update)
    rest: int  # per row: everything else an exact row computes (queries, output, MLP, ...)
    attn_per_key: int  # per (query, key) pair: scores + weighted values (attention layers)
    window: int | None = None  # a sliding-window layer's window (None: full causal attention)
    index: int = 0  # the layer's index in the model


def _mlp_macs(config, layer_index: int, moe: bool) -> int:
    d = config.hidden_size
    experts = (getattr(config, "num_experts", 0) or 0) if moe else 0
    sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
    mlp_only = getattr(config, "mlp_only_layers", None) or []
    if experts and layer_index not in mlp_only and (layer_index + 1) % sparse_step == 0:
        k = config.num_experts_per_tok
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size  # GPT-OSS: the latter
        return d * experts + 3 * d * expert * k + 3 * d * shared + (d if shared else 0)
    return 3 * d * config.intermediate_size


def layer_costs(config) -> list[LayerCost]:
    family = family_class_for(config)
    d = config.hidden_size
    heads, kv_heads, head_dim = attention_shape(config)
    gated = family.gated_attention
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    windows = _windows(config, types)
    costs = []
    for i, kind in enumerate(types):
        mlp = _mlp_macs(config, i, family.moe_mlp)
        if family.linear_attention and kind == "linear_attention":
            kd = config.linear_key_head_dim * config.linear_num_key_heads
            vd = config.linear_value_head_dim * config.linear_num_value_heads
            nv = config.linear_num_value_heads
            conv = (2 * kd + vd) * config.linear_conv_kernel_dim
            # delta rule per value head: S k (read), outer-product update, and the query read
            state = 3 * nv * config.linear_key_head_dim * config.linear_value_head_dim
            write = d * (2 * kd + vd) + 2 * d * nv + conv + state
            rest = d * vd + vd * d + mlp  # output gate projection, out_proj, MLP
            costs.append(LayerCost("recurrent", write, rest, 0, index=i))
        else:
            write = 2 * d * kv_heads * head_dim
            q = d * heads * head_dim * (2 if gated else 1)
            rest = q + heads * head_dim * d + mlp
            costs.append(LayerCost("attention", write, rest, 2 * heads * head_dim, windows[i], index=i))
    return costs


def _windows(config, types: list[str]) -> list[int | None]:
    """Each layer's sliding window: `sliding_attention` layers', or every layer's without `layer_types`."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return [None] * len(types)
    if getattr(config, "layer_types", None):
        return [window if kind == "sliding_attention" else None for kind in types]
    return [window] * len(types)


def causal_pairs(start: int, stop: int, window: int | None = None) -> int:
    """Sum over query positions i in [start, stop) of min(i + 1, window) keys."""
    if window is not None and stop > window:
        full = max(start, window)
        return causal_pairs(start, full) + window * (stop - full) if start < window else window * (stop - start)
    return (stop * (stop + 1) - start * (start + 1)) // 2


def as_method(fill: str | Fill) -> Fill:
    """The fill `fill` names, or `fill` itself when an arm hands its own (bound once, `RidgeFillArm`)."""
    return fill if isinstance(fill, Fill) else fill_named(fill)


def prefill_macs(
    config,
    N: int,
    *,
    split: int | None = None,
    tail: int = 0,
    exact_rows: int = 0,
    fill: str | Fill = FILL_OFF,
    probe_rows: int = 0,
    map_split: bool = DEFAULT_MAP_SPLIT,
) -> int:
    """Multiply-accumulates of one prompt's prefill under an arm (lm_head on the last row only).

    Section 2.5 (Figure 7); `map_split` charges the map at layer S (see the module docstring). `fill`: a
    fill's name, or the fill an arm holds (no lookup by name).
    """
    costs = layer_costs(config)
    L = len(costs)
    total = config.hidden_size * config.vocab_size  # last row's logits
    if fill == FILL_OFF or split is None or tail >= N:
        for c in costs:
            total += N * (c.write + c.rest) + c.attn_per_key * causal_pairs(0, N, c.window)
        return total
    check_split(split, L)
    T = max(tail, 1)
    prefix = N - T
    E = min(max(exact_rows, 0), prefix)
    filled = prefix - E
    first_map = split if map_split else split + 1
    method = as_method(fill)
    for i, c in enumerate(costs):
        if i < split:
            total += N * (c.write + c.rest) + c.attn_per_key * causal_pairs(0, N, c.window)
            continue
        w = N if c.window is None else c.window
        exact_n = T + E
        total += exact_n * (c.write + c.rest)
        total += filled * method.filled_row_macs(config, c, mapped=i >= first_map)
        if method.absent:
            # exact rows attend only to exact rows: tail over (E + its own causal part), selected among themselves
            total += c.attn_per_key * (min(T * E + causal_pairs(0, T), T * w) + causal_pairs(0, E, c.window))
        else:
            total += c.attn_per_key * (causal_pairs(prefix, N, c.window) + E * min(prefix // 2 + 1, w))
        if probe_rows:
            total += probe_rows * (c.write + c.rest) + c.attn_per_key * probe_rows * min(N, w)
    return total


def speedup_ceiling(config, N: int, **arm) -> float:
    """MAC-model speedup ceiling of an arm: exact MACs / arm MACs."""
    return prefill_macs(config, N) / prefill_macs(config, N, **arm)


def cache_rows(config, N: int, *, split: int | None = None, exact_rows: int | None = None,
                  fill: str | Fill = FILL_OFF, capacity: int | None = None) -> int:
    """Rows the attention layers' caches hold after an N-token prefill, summed over those layers: every row,
    except in late layers of a fill whose filled rows are absent (nofill), which hold `exact_rows`; a
    sliding-window layer holds at most its window, and every layer at most `capacity` (FastKV's). Recurrent
    (Gated DeltaNet) layers keep a state of fixed size and are not counted."""
    absent = fill != FILL_OFF and split is not None and as_method(fill).absent
    total = 0
    for i, c in enumerate(layer_costs(config)):
        if c.kind != "attention":
            continue
        rows = N if not absent or i < split or exact_rows is None else min(exact_rows, N)
        rows = rows if capacity is None else min(rows, capacity)
        total += rows if c.window is None else min(rows, c.window)
    return total


def cost_matched_tail(config, N: int, split: int, target_macs: int, fill: str | Fill = NoFill.name) -> int:
    """The longest tail of a `fill` arm (nofill) whose MAC count does not exceed `target_macs` (the paper's
    compute-matched `nofill` control, section 3.3); 1 when none does."""
    return largest_within(1, N, lambda tail: prefill_macs(config, N, split=split, tail=tail, fill=fill), target_macs)
