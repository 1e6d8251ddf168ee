"""The row-fill strategies that supply filled rows' keys and values directly, not their layer input: a mapped
cache (RaReCache's transfer maps, `MappedKV`), a K/V projector from the split state (`PredictedKV`: the
KVA-projector design, SwiftKV's trained projections inside RidgeFill's pipeline), and every row's keys and values
from one (`EveryRowKV`: SwiftKV as released). The interface is `rf_eval.engine.rowfill`."""

from __future__ import annotations

import torch

from rf_eval.engine.plan import FillFn, KVFillFn
from rf_eval.engine.rowfill import AttentionRows, RowFill
from rf_eval.engine.step import LayerStep
from rf_eval.engine.strategies import exact_rows_beside

__all__ = ["EveryRowKV", "MappedKV", "PredictedKV"]


class MappedKV(RowFill):
    """Filled rows' rotated keys and values from a cache-to-cache map (RaReCache section 3).

    `kv_fill(layer, filled rows)` returns them. Every layer may be mapped (split
    0); the exact rows run each layer over the mapped cache. Attention layers only.
    """

    min_split = 0

    def __init__(self, kv_fill: KVFillFn):
        self.kv_fill = kv_fill

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        return exact_rows_beside(step, index, x_exact, self.kv_fill(index, step.rows.filled))

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        raise ValueError("a cache-to-cache fill needs attention layers; this model has recurrent layers")


class PredictedKV(RowFill):
    """Filled rows' late-layer keys and values from `kv_map(layer, x_S rows)`: [keys before RoPE; values]
    per row (`rf_eval.ridge.targets`), the keys then rotated at their own positions (kv_ridge, swiftkv).

    With `own_at_split` layer S's filled rows write the layer's own projections of x_S, which is exact
    (with `plan.map_split`, the map's); without it layer S reads the map too (SwiftKV's projections cover
    every layer from its own split on). In a Gated DeltaNet layer `kv_map` gives the filled rows' normed
    input, which the layer's stock mixer scans (`recurrent`).
    """

    def __init__(self, kv_map: FillFn, own_at_split: bool = True):
        self.kv_map, self.own_at_split = kv_map, own_at_split

    def own_at(self, step: LayerStep, index: int) -> bool:
        """Whether layer `index`'s filled rows take the layer's own projections of x_S (exact) over the map."""
        return index == step.plan.split and self.own_at_split and not step.plan.map_split

    def mapped(self, step: LayerStep, index: int, x_rows: torch.Tensor, rows: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s rotated keys and values for `rows` ("filled", "keys") whose split states are x_rows."""
        flat = self.kv_map(index, x_rows)
        head_dim = step.layers[index].self_attn.head_dim
        heads = flat.shape[-1] // (2 * head_dim)  # (no filled row: a plan whose tail covers the prompt)
        k, v = (t.reshape(*flat.shape[:2], heads, head_dim).transpose(1, 2) for t in flat.chunk(2, dim=-1))
        return step.family.rotate(k, *step.rope_at(index, rows)), v

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        layer = step.layers[index]
        if self.own_at(step, index):
            h = step.family.input_norm(layer, step.x_filled)
            k, v = step.family.kv(layer.self_attn, h, *step.rope_at(index, "filled"))
        else:
            k, v = self.mapped(step, index, step.x_filled, "filled")
        return exact_rows_beside(step, index, x_exact, (k, v))

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        """A Gated DeltaNet layer: its stock mixer scans every row, the filled rows' normed input from
        `kv_map` (at layer S with `own_at_split`, the layer's own norm of x_S); the exact rows' outputs."""
        layer = step.layers[index]
        h = torch.empty_like(step.inputs.x_split)
        if self.own_at(step, index):
            h[:, step.rows.filled] = step.family.input_norm(layer, step.x_filled)
        else:
            h[:, step.rows.filled] = self.kv_map(index, step.x_filled).to(h)
        h[:, step.rows.exact] = step.family.input_norm(layer, x_exact)
        mixed = layer.linear_attn(hidden_states=h, cache=step.cache, attention_mask=None)
        return mixed[:, step.rows.exact]


class EveryRowKV(PredictedKV):
    """Every row's late-layer keys and values, the exact rows' too, from `kv_map` of its split state;
    queries, attention output and MLP run for the exact rows from their own inputs (SwiftKV's own forward,
    `swiftkv_released`: the exact rows' late outputs read no other row's late state, so the last row's
    logits do not depend on the tail)."""

    def __init__(self, kv_map: FillFn):
        super().__init__(kv_map, own_at_split=False)

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        k, v = self.mapped(step, index, step.inputs.x_split[:, step.rows.keys], "keys")
        return AttentionRows(step.family.input_norm(step.layers[index], x_exact), k, v)

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        raise ValueError("keys and values of every row need attention layers; this model has Gated DeltaNet layers")
