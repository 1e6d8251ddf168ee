"""RaReCache's recompute budget (paper section 3): ceil(rho * T) prompt positions, or ceil(rho * L) target
layers for the layer-prefix baseline, or, with `budget=`, the most positions (layers) a share of exact
prefill's MACs pays for. The selectors that spend it are `rf_eval.selectors.mapped_cache`."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rf_eval.cost.budget import Knob
from rf_eval.rarecache.cost import EquationCost


def recompute_count(rho: float, total: int) -> int:
    """ceil(rho * total), exact for decimal rho (0.3 * 10 is 3, not 4)."""
    if not 0 <= rho <= 1:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    return math.ceil(Fraction(repr(float(rho))) * total)


def layer_budget(rho: float, n_layers: int) -> int:
    """Layers the layer-prefix baseline recomputes at the same budget: ceil(rho * L)."""
    return recompute_count(rho, n_layers)


def rarecache_knob(budget_share: float | None, costs: Any, whole_layers: bool, max_length: int) -> Knob | None:
    """The knob `budget=` turns on a RaReCache arm (None without a budget): the recomputed positions k of a
    T-token prompt (1..T, the last row always among them), or for the layer-prefix baseline the recomputed
    layers (0..L), each the most whose MACs (`rf_eval.rarecache.cost.EquationCost`) fit the budget."""
    if budget_share is None:
        return None
    if whole_layers:
        return Knob("layers", float(budget_share), costs.layers, costs.exact, lambda n: 0,
                    lambda n: costs.n_layers, max_length=max_length)
    return Knob("rows", float(budget_share), costs.rows, costs.exact, lambda n: 1, lambda n: n,
                max_length=max_length)


def knob_from_configs(arm: Any, maps: Any, source_config: Any, target_config: Any) -> Knob | None:
    """The knob of a RaReCache arm (`rarecache_knob`) from the configs alone, before any weights load: the
    parameter counts of eq. 11 read off models built on the meta device."""
    with torch.device("meta"):
        target, source = (AutoModelForCausalLM.from_config(c) for c in (target_config, source_config))
    positions = getattr(target_config, "max_position_embeddings", None) or 1 << 20
    return rarecache_knob(arm.budget, EquationCost(target, source, maps), arm.selector_obj.whole_layers,
                          int(positions))
