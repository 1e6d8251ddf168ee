"""RaReCache's recompute budget (paper section 3): ceil(rho * T) prompt positions, or ceil(rho * L) target
layers for the layer-prefix baseline. The selectors that spend it are `rf_eval.selectors.mapped_cache`."""

from __future__ import annotations

import math
from fractions import Fraction


def budget(rho: float, total: int) -> int:
    """ceil(rho * total), exact for decimal rho (0.3 * 10 is 3, not 4)."""
    if not 0 <= rho <= 1:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    return math.ceil(Fraction(repr(float(rho))) * total)


def layer_budget(rho: float, n_layers: int) -> int:
    """Layers the layer-prefix baseline recomputes at the same budget: ceil(rho * L)."""
    return budget(rho, n_layers)
