"""`terminal_state(path=FILE)`: rho * Delta-M added once to each late Gated DeltaNet layer's state at the end
of the prefix (paper appendix H; the table and rho: `rf_eval.ridge.state_correction`). `scale=one` adds
Delta-M unscaled (the ablation appendix H compares)."""

from __future__ import annotations

from typing import Any

import torch

from rf_eval.engine import LayerView, Plan
from rf_eval.fills import fill_named
from rf_eval.ridge.state_correction import filled_share, load_table
from rf_eval.ridgefill.corrections.base import Correction


class TerminalState(Correction):
    """rho * Delta-M added to each late Gated DeltaNet layer's state at the end of the prefix."""

    name = "terminal_state"

    def __init__(self, path: str, scale: str = "rho"):
        if scale not in ("rho", "one"):
            raise ValueError(f"scale must be 'rho' or 'one', got {scale!r}")
        self.path, self.scale = str(path), scale
        self.delta, self.metadata = load_table(path)
        self.last_rho: dict[int, torch.Tensor] = {}

    def describe(self) -> dict[str, Any]:
        keep = ("config_hash", "fill", "maps_sha256", "every", "states", "split", "map_split")
        return {**super().describe(), **{k: self.metadata.get(k) for k in keep}}

    def check(self, config_hash: str, plan: Plan, maps_sha: str) -> None:
        meta = self.metadata
        if meta.get("config_hash") != config_hash:
            raise ValueError(f"{self.path} was fitted for another model (config hash differs)")
        if int(meta["split"]) != plan.split:
            raise ValueError(f"{self.path} was fitted at split {meta['split']}, this arm runs split {plan.split}")
        # an arm (`RidgeFillArm`) hands its fill, made once; a bare plan names its fill
        with_maps = (plan.fill_obj if hasattr(plan, "fill_obj") else fill_named(plan.fill)).needs_maps
        if meta.get("fill") != plan.fill or (with_maps and meta.get("maps_sha256") != maps_sha):
            raise ValueError(f"{self.path} was fitted for fill {meta.get('fill')!r} with other maps than this arm's")
        fitted_split_map = meta.get("map_split", "false") == "true"  # files before the field: layer S read x_S
        if with_maps and fitted_split_map != bool(getattr(plan, "map_split", True)):
            raise ValueError(f"{self.path} was fitted with map_split={str(fitted_split_map).lower()}, this arm "
                             f"runs map_split={str(plan.map_split).lower()} (refit with `rf-eval "
                             "fit-state-correction`, or set map_split to match)")

    def prefix_state(self, view: LayerView, state: torch.Tensor) -> torch.Tensor:
        if view.index not in self.delta:
            raise ValueError(f"{self.path} holds no Delta-M for layer {view.index}")
        end = view.prefix_end
        if self.scale == "one":
            rho = torch.ones(state.shape[1], dtype=torch.float64)
        else:
            filled = torch.ones(end, dtype=torch.bool)
            exact = view.exact.cpu()
            filled[exact[exact < end]] = False
            rho = filled_share(view.family.log_gates(view.layer.linear_attn, view.h[:, :end]), filled).cpu()
        self.last_rho[view.index] = rho
        delta = self.delta[view.index].to(device=state.device, dtype=torch.float32)
        return state + (rho.float().to(state.device)[:, None, None] * delta)[None].to(state.dtype)
