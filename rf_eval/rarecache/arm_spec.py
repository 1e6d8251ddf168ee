"""`RaReCacheArm`: one RaReCache arm, written once, checked once (as `rf_eval.ridgefill.arm_spec.RidgeFillArm`).

Paper section 3: `rho` is the recompute budget in [0, 1] (ceil(rho * T)
positions, or ceil(rho * L) layers for `layer-prefix`); `selector` chooses the
positions (`rf_eval.selectors.mapped_cache`, the registry's RaReCache selectors; the oracles are labelled
in provenance); `seed` seeds random-positions (and, in the adapter, sampled
generation). Built the same way from model_args and Python keyword arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rf_eval.fields import ArmError, build


@dataclass(frozen=True, kw_only=True)
class RaReCacheArm:
    rho: float = 0.3
    selector: str = "rank"
    seed: int | None = None  # None: 0 for random-positions, lm-eval's --seed for sampling

    def __post_init__(self) -> None:
        from rf_eval.selectors.registry import cache_selector

        if not 0 <= self.rho <= 1:
            raise ArmError(f"rho must be in [0, 1], got {self.rho}")
        try:
            cache_selector(self.selector)
        except ValueError as err:
            raise ArmError(str(err)) from None

    @classmethod
    def from_fields(cls, values: dict[str, Any], *, what: str = "arm") -> RaReCacheArm:
        return build(cls, values, what=what)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def updated(self, fields: dict[str, Any], *, what: str = "arm") -> RaReCacheArm:
        """This arm with `fields` applied (a served request's arm)."""
        merged = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return RaReCacheArm.from_fields({**merged, **fields}, what=what)
