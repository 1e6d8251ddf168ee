"""`DropArm`: one arm of a token-dropping method, written once, checked once (as `RidgeFillArm`).

`method`: a dropper of `rf_eval.drop.DROP_METHODS` (gemfilter, specprefill; FastKV's
token-selective propagation runs in RidgeFill's engine instead, `preset=fastkv`).
How many rows a prompt keeps: `keep` (a count; GemFilter's k, default 1,024) or
`keep_share` (a share of the prompt's rows; Speculative Prefill's, default 0.1),
or `budget` (a share of exact prefill's MACs: the kept rows, or chunks, are set
per prompt length to spend it, `rf_eval.budget`). GemFilter: `filter_layer` (r,
default 13/32 of the depth). Speculative Prefill: the speculator is the adapter's
`source`; `lookahead` (8) and `chunk` (32) as the authors' main configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rf_eval.budget import check_budget
from rf_eval.fields import ArmError, build

__all__ = ["DROPPERS", "DropArm"]

#: the droppers an arm can name (`rf_eval.drop.DROP_METHODS`), and the settings that are theirs alone
DROPPERS = {"gemfilter": ("filter_layer",), "specprefill": ("lookahead", "chunk")}


@dataclass(frozen=True, kw_only=True)
class DropArm:
    method: str = "gemfilter"
    keep: int | None = None
    keep_share: float | None = None
    budget: float | None = None
    filter_layer: int | None = None
    lookahead: int = 8
    chunk: int = 32

    def __post_init__(self) -> None:
        if self.method not in DROPPERS:
            raise ArmError(f"method={self.method!r} is not a dropper; valid: {', '.join(DROPPERS)} (FastKV runs as "
                           "--model ridgefill with preset=fastkv)")
        given = [name for name in ("keep", "keep_share", "budget") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ArmError(f"give one of keep, keep_share and budget, not {' and '.join(given)}: each sets the rows kept")
        if self.keep is not None and self.keep < 1:
            raise ArmError(f"keep={self.keep}: a dropper keeps at least 1 row")
        if self.keep_share is not None and not 0 < self.keep_share <= 1:
            raise ArmError(f"keep_share={self.keep_share!r} is not a share of the prompt's rows; give 0 < keep_share <= 1")
        check_budget(self.budget)
        if self.method == "specprefill" and self.keep is not None:
            raise ArmError("specprefill keeps whole chunks: give keep_share (its authors' percentage) or budget, not keep")
        if self.lookahead < 1 or self.chunk < 1:
            raise ArmError(f"lookahead and chunk must be >= 1; got lookahead={self.lookahead}, chunk={self.chunk}")
        others = [f for m, fields in DROPPERS.items() if m != self.method for f in fields
                  if getattr(self, f) != _default(f)]
        if others:
            raise ArmError(f"{', '.join(others)} belong(s) to another dropper than method={self.method}; leave out")

    @property
    def keep_share_or_default(self) -> float:
        return 0.1 if self.keep_share is None else self.keep_share

    @classmethod
    def from_fields(cls, values: dict[str, Any], *, what: str = "arm") -> DropArm:
        return build(cls, values, what=what)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def updated(self, fields: dict[str, Any], *, what: str = "arm") -> DropArm:
        """This arm with `fields` applied (a served request's arm); a new keep, keep_share or budget replaces
        the others."""
        merged = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if any(fields.get(k) is not None for k in ("keep", "keep_share", "budget")):
            merged = {k: v for k, v in merged.items() if k not in ("keep", "keep_share", "budget")}
        return DropArm.from_fields({**merged, **fields}, what=what)

    def describe(self) -> dict[str, Any]:
        own = DROPPERS[self.method]
        out = {"method": self.method, "keep": self.keep, "keep_share": self.keep_share,
               **{f: getattr(self, f) for f in own}}
        if self.budget is not None:
            out.update(budget=self.budget, knob="chunks" if self.method == "specprefill" else "rows")
        return out


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(DropArm) if f.name == name)
