"""`RaReCacheArm`: one RaReCache arm, written once, checked once (as `rf_eval.ridgefill.arm_spec.RidgeFillArm`).

Paper section 3: `rho` is the recompute budget in [0, 1] (ceil(rho * T)
positions, or ceil(rho * L) layers for `layer-prefix`; default 0.3); `selector` chooses the
positions (`rf_eval.selectors.mapped_cache`, the registry's RaReCache selectors; the oracles are labelled
in provenance); `seed` seeds random-positions (and, in the adapter, sampled
generation). `budget` (a share of exact prefill's MACs, in place of `rho`): the recomputed positions (or
layers) are set per prompt length to spend it, by eq. 11's count with the source's prefill charged
(`rf_eval.rarecache.cost.EquationCost`, `rf_eval.cost.budget`). Built the same way from model_args and Python
keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rf_eval.cost.budget import check_budget
from rf_eval.fields import ArmError
from rf_eval.selectors.registry import cache_selector

DEFAULT_RHO = 0.3


@dataclass(frozen=True, kw_only=True)
class RaReCacheArm:
    rho: float | None = None  # None: DEFAULT_RHO, or set per length by `budget`
    selector: str = "rank"
    seed: int | None = None  # None: 0 for random-positions, lm-eval's --seed for sampling
    budget: float | None = None  # a share of exact's MACs: the recomputed rows (layers) set per length to spend it

    def __post_init__(self) -> None:
        if self.rho is not None and not 0 <= self.rho <= 1:
            raise ArmError(f"rho must be in [0, 1], got {self.rho}")
        check_budget(self.budget)
        if self.budget is not None and self.rho is not None:
            raise ArmError(f"give rho or budget, not both: budget={self.budget:g} sets the recomputed share per "
                           "prompt length")
        try:  # the selector's one object for this arm: the method runs it, never the name again
            object.__setattr__(self, "_selector", cache_selector(self.selector))
        except ValueError as err:
            raise ArmError(str(err)) from None

    @property
    def selector_obj(self) -> Any:
        """The arm's position selector (a `rf_eval.selectors.mapped_cache.CacheSelector`), made once."""
        return self._selector

    @property
    def recompute_share(self) -> float | None:
        """rho as the arm runs it (None: set per length by the budget)."""
        return None if self.budget is not None else (DEFAULT_RHO if self.rho is None else float(self.rho))
