"""`ridge`: each late layer's input predicted from x_S by a closed-form ridge map (RidgeFill paper section 2.2)."""

from __future__ import annotations

from typing import Any

import torch

from rf_eval.fields import ArmError
from rf_eval.fills.base import Fill


class Ridge(Fill):
    name = "ridge"
    summary = "late layers' filled rows read A_l x_S + b_l, ridge maps fitted on the model's own states"
    needs_maps = True
    fit_command = "fit"
    fit_target = "inputs"
    source = "RidgeFill §2.2"
    cost = "K/V projections or the state update, plus the map A_l x_S (d x d) where the layer reads it"

    def fill_fn(self, maps: Any, dtype: torch.dtype, device: torch.device) -> Any:
        return maps.fill_fn(dtype, device)

    def check(self, model_config: Any, maps: Any) -> None:
        super().check(model_config, maps)
        target = (maps.metadata or {}).get("target", self.fit_target) if maps is not None else self.fit_target
        if target != self.fit_target:
            raise ArmError(f"fill={self.name} reads maps of late layers' inputs; {maps.where()} holds maps of "
                           f"target {target!r} (fitted for fill={maps.metadata.get('fill')})")

    def filled_row_macs(self, config: Any, layer: Any, mapped: bool) -> int:
        """The layer's K/V or state update, plus the map (d x d per row) where the layer reads it."""
        return layer.write + (config.hidden_size**2 if mapped else 0)
