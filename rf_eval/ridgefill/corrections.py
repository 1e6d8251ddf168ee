"""Corrections to a filled cache (paper section 2.3, 6.6) and splices (section 6.6), as late-layer hooks.

`value_rescale(c=512)`: in each late attention layer the first c tail rows
(c capped at the tail) go through the layer's value projection from their
true input and from the fill's prediction for the same rows; per key-value
head, the ratio of the exact value norm to the predicted one, averaged over
the c rows (a mean of per-row ratios, the paper's section 2.3 definition),
scales the filled rows' values (measured on every request).
`reduce=ratio_of_means` takes the ratio of the two mean norms instead.
`key_rescale(c=512)`: the same on keys (after k-norm; RoPE keeps norms, so
scaling rotated keys equals scaling before RoPE).
`terminal_state(path=FILE)`: adds rho * Delta-M once to each late Gated
DeltaNet layer's state at the end of the prefix (`rf_eval.ridgefill.state_correction`).
`scale=one` adds Delta-M unscaled (the ablation appendix H compares).

Splices replace the filled rows' keys, values or both with the exact ones in
every filled attention layer, from an exact reference prefill of the same
prompt. The paper inserts exact keys before RoPE and rotates them at their
own positions; the reference cache holds exactly that, RoPE(k_exact_j, j),
computed by the same rotation with the same tables, so copying the cached
rotated key is the same operation (tests/ridgefill/test_corrections.py checks it).
Gated DeltaNet layers stay filled under every splice, as in the paper.
Order: corrections run first, a splice last (it overrides what it replaces).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rf_eval.engine import LateLayerHooks, LayerView, Plan, new_cache
from rf_eval.ridgefill.state_correction import filled_share, load_table
from rf_eval.spec import check_params, parse_spec

SPLICES = ("keys", "values", "both")
#: How a rescale reduces its c per-row norm ratios; the first (the paper's) is the default.
REDUCTIONS = ("mean_of_ratios", "ratio_of_means")


class Rescale:
    """Per-KV-head norm ratio on the first c tail rows, applied to the filled rows' values or keys."""

    part = "values"

    def __init__(self, c: int = 512, reduce: str = "mean_of_ratios"):
        if c < 1:
            raise ValueError(f"c must be >= 1, got {c}")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce={reduce!r} is not valid; valid reductions: {', '.join(REDUCTIONS)}")
        self.c, self.reduce = int(c), reduce
        self.last_scales: dict[int, torch.Tensor] = {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "c": self.c, "reduce": self.reduce}

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


class TerminalState:
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
        return {"name": self.name, "path": self.path, "scale": self.scale,
                **{k: self.metadata.get(k) for k in keep}}

    def check(self, config_hash: str, plan: Plan, maps_sha: str) -> None:
        meta = self.metadata
        if meta.get("config_hash") != config_hash:
            raise ValueError(f"{self.path} was fitted for another model (config hash differs)")
        if int(meta["split"]) != plan.split:
            raise ValueError(f"{self.path} was fitted at split {meta['split']}, this arm runs split {plan.split}")
        from rf_eval.fills import fill_method

        with_maps = fill_method(plan.fill).needs_maps
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


CORRECTIONS = {cls.name: cls for cls in (ValueRescale, KeyRescale, TerminalState)}
_PARAMS = {"value_rescale": ("c", "reduce"), "key_rescale": ("c", "reduce"), "terminal_state": ("path", "scale")}


def make_correction(name: str, **params: Any):
    """A correction by name; clear errors for unknown names and parameters."""
    if name not in CORRECTIONS:
        raise ValueError(f"unknown correction {name!r}; valid corrections: {', '.join(CORRECTIONS)}")
    check_params("correction", name, params, _PARAMS[name])
    if name == "terminal_state" and "path" not in params:
        raise ValueError("correction 'terminal_state' needs path= (a file from `rf-eval fit-state-correction`)")
    return CORRECTIONS[name](**params)


def corrections_from(spec: str | Sequence | None) -> list:
    """Corrections from a spec ('value_rescale(c=512)+terminal_state(path=F)'), a list of specs/objects, or None."""
    if spec is None or spec == "" or spec == []:
        return []
    if isinstance(spec, str):
        return [make_correction(name, **params) for name, params in parse_spec(spec)]
    out = []
    for item in spec:
        if isinstance(item, str):
            out.extend(corrections_from(item))
        elif isinstance(item, dict):
            params = dict(item)
            out.append(make_correction(params.pop("name"), **params))
        else:
            out.append(item)
    return out


def splice_kv(part: str, reference):
    """A kv hook copying the exact reference cache's keys/values into the filled rows."""

    def kv(view: LayerView, k: torch.Tensor, v: torch.Tensor):
        rows = view.filled
        if rows.numel() == 0:
            return k, v
        layer = reference.layers[view.index]
        if part in ("keys", "both"):
            k[:, :, rows] = layer.keys[:, :, rows].to(k)
        if part in ("values", "both"):
            v[:, :, rows] = layer.values[:, :, rows].to(v)
        return k, v

    return kv


@torch.no_grad()
def reference_cache(model, input_ids: torch.Tensor):
    """The stock prefill's cache with every row's K/V kept: its sliding-window layers hold the whole prompt
    (the model's own `DynamicSlidingWindowLayer` keeps only the last window - 1 rows)."""
    from transformers.cache_utils import DynamicLayer

    cache = new_cache(model)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def build_hooks(corrections: list, splice: str | None, model, input_ids: torch.Tensor) -> LateLayerHooks | None:
    """One LateLayerHooks for a request: kv corrections, then the splice; the state correction."""
    kv_steps = [c.kv for c in corrections if hasattr(c, "kv")]
    states = [c.prefix_state for c in corrections if hasattr(c, "prefix_state")]
    if splice is not None:
        kv_steps.append(splice_kv(splice, reference_cache(model, input_ids)))
    if not kv_steps and not states:
        return None

    def kv(view, k, v):
        for step in kv_steps:
            k, v = step(view, k, v)
        return k, v

    def prefix_state(view, state):
        for step in states:
            state = step(view, state)
        return state

    return LateLayerHooks(kv=kv if kv_steps else None, prefix_state=prefix_state if states else None)
