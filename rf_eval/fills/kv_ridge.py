"""`kv_ridge`: late layers' keys and values written directly from x_S by closed-form ridge maps.

The KV-projector design RidgeFill's section 1 contrasts with (predict the
cache writes, not the layer input), fitted the way RidgeFill fits: one
capture pass, the same running sums, a ridge map per late attention layer
from x_S to its keys before RoPE (after k-norm) and its values, lambda chosen
by the held-out cache-write cosine (`rf-eval fit --fill kv_ridge`;
`rf_eval.ridge.targets`). It puts the paper's design choice to a test:
ridge against kv_ridge at equal split, tail and rows.

Filled rows' keys are rotated at their own positions with the layer's RoPE;
layer S's filled rows write the layer's own projections of x_S, which is
exact (with `map_split`, the map's). Exact rows run every layer over them.
A Gated DeltaNet layer caches no keys and values: its map predicts what its
stock mixer reads, the normed input, and the mixer scans that for the filled
rows (`rf_eval.ridge.targets`). A projector trained elsewhere loads the
same way: a map file whose tensors
`A.<layer>` (2 x kv_heads x head_dim, d) and `b.<layer>` give [keys; values]
= A x_S + b, with metadata `target` "kv" (`rf_eval.ridge.maps`).
"""

from __future__ import annotations

from typing import Any

import torch

from rf_eval.engine.kv_strategies import PredictedKV
from rf_eval.fields import ArmError
from rf_eval.fills.base import Fill
from rf_eval.ridge.targets import kv_width


class KvRidge(Fill):
    name = "kv_ridge"
    summary = "late layers' keys and values written from x_S by ridge maps (a closed-form K/V projector)"
    strategy = "kv"
    needs_maps = True
    fit_command = "fit --fill kv_ridge"
    fit_target = "kv"
    source = "RidgeFill §1 (the K/V-projector design), fitted as §2.2"
    cost = ("the map [K; V] = A_l x_S (2 x kv width x d) where the layer reads it, else the K/V projections "
            "(Gated DeltaNet: the map to its normed input, d x d, and the state update)")

    def fill_fn(self, maps: Any, dtype: torch.dtype, device: torch.device) -> Any:
        return maps.fill_fn(dtype, device)

    def row_fill(self, fill_fn: Any) -> Any:
        if fill_fn is None:
            raise ValueError(f"fill {self.name!r} needs its maps")
        return PredictedKV(fill_fn)

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        if not mapped:
            return layer.write
        if layer.kind == "recurrent":  # the map to the normed input (d x d), then the layer's state update
            return config.hidden_size**2 + layer.write
        return config.hidden_size * kv_width(config)

    def check(self, model_config: Any, maps: Any) -> None:
        super().check(model_config, maps)
        target = (maps.metadata or {}).get("target", "inputs")
        if target != self.fit_target:
            raise ArmError(f"fill={self.name} reads maps of keys and values (`rf-eval {self.fit_command}`); "
                           f"{maps.where()} holds maps of late layers' {target}")
