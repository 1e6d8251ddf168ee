"""`value_rescale(c=512)` and `key_rescale(c=512)` (paper sections 2.3, 6.6).

In each late attention layer the first c tail rows (c capped at the tail) go
through the layer's value projection from their true input and from the fill's
prediction for the same rows; per key-value head, the ratio of the exact value
norm to the predicted one, averaged over the c rows (a mean of per-row ratios,
the paper's section 2.3 definition), scales the filled rows' values (measured
on every request). `reduce=ratio_of_means` takes the ratio of the two mean
norms instead. `key_rescale` does the same on keys (after k-norm; RoPE keeps
norms, so scaling rotated keys equals scaling before RoPE).
"""

from __future__ import annotations

import torch

from rf_eval.engine import LayerView
from rf_eval.ridgefill.corrections.base import Correction

#: How a rescale reduces its c per-row norm ratios; the first (the paper's) is the default.
REDUCTIONS = ("mean_of_ratios", "ratio_of_means")


class Rescale(Correction):
    """Per-KV-head norm ratio on the first c tail rows, applied to the filled rows' values or keys."""

    part = "values"

    def __init__(self, c: int = 512, reduce: str = "mean_of_ratios"):
        if c < 1:
            raise ValueError(f"c must be >= 1, got {c}")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce={reduce!r} is not valid; valid reductions: {', '.join(REDUCTIONS)}")
        self.c, self.reduce = int(c), reduce
        self.last_scales: dict[int, torch.Tensor] = {}

    def scales(self, view: LayerView) -> torch.Tensor:
        """(1, kv_heads) exact/predicted norm ratio on the first c tail rows of this layer."""
        start = view.prefix_end
        rows = torch.arange(start, start + min(self.c, view.plan.tail), device=view.h.device)
        attn = view.layer.self_attn
        h_pred = view.family.input_norm(view.layer, view.predict(view.inputs.x_split[:, rows]))
        true = view.family.project_kv(attn, view.h[:, rows])
        pred = view.family.project_kv(attn, h_pred)
        side = 1 if self.part == "values" else 0
        nt, np_ = true[side].float().norm(dim=-1), pred[side].float().norm(dim=-1)  # (1, kv_heads, c)
        if self.reduce == "mean_of_ratios":
            return (nt / np_.clamp_min(1e-12)).mean(-1)
        return nt.mean(-1) / np_.mean(-1).clamp_min(1e-12)

    def kv(self, view: LayerView, k: torch.Tensor, v: torch.Tensor):
        if view.filled.numel() == 0:
            return k, v
        scale = self.scales(view)
        self.last_scales[view.index] = scale.detach().cpu()
        target = v if self.part == "values" else k
        rows = view.filled
        target[:, :, rows] = target[:, :, rows] * scale[..., None, None].to(target.dtype)
        return k, v


class ValueRescale(Rescale):
    name = "value_rescale"
    part = "values"


class KeyRescale(Rescale):
    name = "key_rescale"
    part = "keys"
