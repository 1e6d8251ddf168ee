"""One bound arm's parts run as one engine call per prompt (`prefill_arm`), and the cost-matched control.

The arm (`rf_eval.ridgefill.arm_spec.RidgeFillArm`) holds its parts as objects,
parsed once; `prefill_arm` wires them into the engine for one prompt:
- selector: exact prefix rows (`rf_eval.selectors`), or a bare callable
  `(PrefillContext) -> rows` as before;
- corrections: value/key rescale, terminal-state correction (`rf_eval.ridgefill.corrections`);
- splice: keys | values | both, from an exact reference prefill of the same prompt;
- sparse: a sparse-attention method's pattern in the exact layers (`rf_eval.sparse.fill_part`);
- cost_match: the compute-matched `nofill` control (paper section 3.3): the
  tail is lengthened, per prompt length N, to the longest tail whose MAC
  count (`rf_eval.cost.mac_model`) does not exceed the matched arm's. The matched arm
  is a fill with filled rows (identity, ridge, ...) with `tail` (default: this arm's tail),
  `exact_share` (exact prefix rows as a share of N, e.g. 0.1 for the
  attention selector's rows) or `exact_rows` (a count), and `probe_rows`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rf_eval import engine
from rf_eval.arm_string import check_params, parse_parts
from rf_eval.cost.mac_model import cost_matched_tail, prefill_macs
from rf_eval.engine import Plan, PrefillResult
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.engine.rowfill import RowFill
from rf_eval.fields import ArmError
from rf_eval.fills import FILLS, Fill, fill_named, registered_fills
from rf_eval.fills.ridge import Ridge
from rf_eval.ridgefill.arm_cost import knob_name
from rf_eval.ridgefill.corrections import build_hooks, corrections_from
from rf_eval.selectors import selector_from
from rf_eval.selectors.base import Request, Selector
from rf_eval.sparse.fill_part import sparse_from


@dataclass(frozen=True)
class CostMatch:
    """The arm whose MAC count a `nofill` control's tail is matched to."""

    fill: str = Ridge.name
    tail: int | None = None
    exact_share: float = 0.0
    exact_rows: int | None = None
    probe_rows: int = 0

    def __post_init__(self):
        method = fill_named(self.fill) if self.fill in FILLS else None
        if method is None or method.absent:  # the fills with filled rows are listed for the error alone
            fills = [n for n in registered_fills() if not fill_named(n).absent]
            raise ValueError(f"cost_match fill must be a fill with filled rows ({', '.join(fills)}), got {self.fill!r}")
        object.__setattr__(self, "_method", method)  # the matched fill's one object: the MAC model reads it
        if self.tail is not None and not (isinstance(self.tail, int) and self.tail >= 1):
            raise ValueError(f"cost_match tail must be an integer >= 1, got {self.tail!r}")
        if not (isinstance(self.exact_share, (int, float)) and 0 <= self.exact_share <= 1):
            raise ValueError(f"cost_match exact_share must be a share of the prompt in [0, 1], got {self.exact_share!r}")
        for name in ("exact_rows", "probe_rows"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 0):
                raise ValueError(f"cost_match {name} must be an integer >= 0, got {value!r}")

    def target_macs(self, config, n: int, split: int, own_tail: int, map_split: bool = DEFAULT_MAP_SPLIT) -> int:
        """The matched arm's MACs; `map_split` (the control's own arm field) charges its map at layer S."""
        exact = self.exact_rows if self.exact_rows is not None else int(round(self.exact_share * n))
        return prefill_macs(config, n, split=split, tail=self.tail or own_tail, exact_rows=exact,
                            fill=self._method, probe_rows=self.probe_rows, map_split=map_split)

    def tail_for(self, config, n: int, split: int, own_tail: int, map_split: bool = DEFAULT_MAP_SPLIT,
                 control: Fill | None = None) -> int:
        """The control's tail at n tokens; `control`: the control arm's own fill (default nofill)."""
        target = self.target_macs(config, n, split, own_tail, map_split)
        return cost_matched_tail(config, n, split, target, **({"fill": control} if control is not None else {}))

    def describe(self) -> dict[str, Any]:
        return {"name": "cost_match", **dataclasses.asdict(self)}


def cost_match_from(spec: str | dict | CostMatch | None) -> CostMatch | None:
    """`ridge`, `ridge(tail=4096;exact_share=0.1)`, a dict, or a CostMatch."""
    if spec is None or isinstance(spec, CostMatch):
        return spec
    if isinstance(spec, dict):
        return CostMatch(**spec)
    (name, params), *rest = parse_parts(spec)
    if rest:
        raise ValueError(f"cost_match names one arm, got {spec!r}")
    check_params("cost_match", name, params, ("tail", "exact_share", "exact_rows", "probe_rows"))
    return CostMatch(fill=name, **params)


def prefill_arm(model: nn.Module, tokenizer: Any, arm: Any, input_ids: torch.Tensor, plan: Plan,
                strategy: RowFill | None, *, resources: dict[str, Any] | None = None,
                row_budget: int | None = None) -> PrefillResult:
    """Run `plan` (the prompt's: `RidgeFillArm.plan_for`) with `arm`'s selector, corrections and splice over
    `strategy`, the arm's row-fill strategy bound to this model once (None for the exact arm: no row is
    filled). `row_budget`: the rows a budget grants the selector (`RidgeFillArm.row_budget`)."""
    selector = arm.selector_obj
    select, capture = selector, None
    if isinstance(selector, Selector):
        req = Request(model, tokenizer, input_ids, plan, getattr(strategy, "fill", None), resources or {},
                      strategy=strategy)
        req.row_budget = row_budget
        wanted = selector.captures(req)
        req.capture_start = {layer: start for layer, (start, _) in wanted.items()}
        capture = {layer: slice(start, stop) for layer, (start, stop) in wanted.items()} or None

        def select(ctx):
            return selector.select(req.attach(ctx))

    hooks = build_hooks(arm.correction_objs, arm.splice, model, input_ids)
    return engine.prefill(model, input_ids, plan, fill=strategy, select=select, capture=capture, hooks=hooks)


def arm_parts(arm: Any) -> dict[str, Any]:
    """A `RidgeFillArm`'s selector, corrections, cost match and sparse part parsed once, by their own registries
    (an ArmError naming the key)."""
    def selector(value):
        return selector_from(value) if isinstance(value, (str, dict)) else value

    out: dict[str, Any] = {}
    for name, parse in (("selector", selector), ("corrections", corrections_from), ("cost_match", cost_match_from),
                        ("sparse", sparse_from)):
        value = getattr(arm, name)
        try:
            out[name] = parse(value)
        except (ValueError, TypeError, OSError) as err:
            raise ArmError(f"{name}={value!r}: {err}") from err
    return out


def describe_arm(arm: Any) -> dict[str, Any]:
    """What results record about a `RidgeFillArm` (parts by name and parameters)."""
    sel = arm.selector_obj
    knob = knob_name(arm.preset, sel) if arm.budget is not None else None
    # a budget that turns the tail sets it per prompt (each sample's `knob_value`); the given tail then
    # only bounds the filled region the tasks score (`rf_eval.tasks.common.filled_tail`), and says so
    tail = {"tail": None, "scored_tail": arm.tail} if knob == "tail" else {"tail": arm.tail}
    return {
        "fill": arm.fill,
        "split": arm.split,
        **tail,
        "chunk_size": arm.chunk_size,
        "map_split": arm.map_split,
        **({"maps_device": arm.maps_device} if arm.maps_device != "model" else {}),
        "selector": sel.describe() if hasattr(sel, "describe") else None,
        "corrections": [c.describe() for c in arm.correction_objs],
        "splice": arm.splice,
        "cost_match": arm.cost_match_obj.describe() if arm.cost_match_obj else None,
        **({"sparse": arm.sparse_obj.describe()} if arm.sparse_obj is not None else {}),
        **({"preset": arm.preset} if arm.preset else {}),
        **({"budget": arm.budget, "knob": knob} if arm.budget is not None else {}),
    }
