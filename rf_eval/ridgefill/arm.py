"""One arm of the study: a plan plus its pluggable parts, wired into one engine call per prompt.

Parts (each named, with parameters, recorded by `describe()`):
- selector: exact prefix rows (`rf_eval.selectors`), or a bare callable
  `(PrefillContext) -> rows` as before;
- corrections: value/key rescale, terminal-state correction (`rf_eval.ridgefill.corrections`);
- splice: keys | values | both, from an exact reference prefill of the same prompt;
- cost_match: the compute-matched `nofill` control (paper section 3.3): the
  tail is lengthened, per prompt length N, to the longest tail whose MAC
  count (`rf_eval.mac_model`) does not exceed the matched arm's. The matched arm
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
from rf_eval.engine import Plan, PrefillResult
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT, FILL_OFF
from rf_eval.engine.rowfill import RowFill
from rf_eval.fills import fill_method, registered_fills
from rf_eval.fills.ridge import Ridge
from rf_eval.mac_model import cost_matched_tail, prefill_macs
from rf_eval.ridgefill.corrections import build_hooks
from rf_eval.selectors.base import Request, Selector


@dataclass(frozen=True)
class CostMatch:
    """The arm whose MAC count a `nofill` control's tail is matched to."""

    fill: str = Ridge.name
    tail: int | None = None
    exact_share: float = 0.0
    exact_rows: int | None = None
    probe_rows: int = 0

    def __post_init__(self):
        fills = [n for n in registered_fills() if not fill_method(n).absent]
        if self.fill not in fills:
            raise ValueError(f"cost_match fill must be a fill with filled rows ({', '.join(fills)}), got {self.fill!r}")
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
                            fill=self.fill, probe_rows=self.probe_rows, map_split=map_split)

    def tail_for(self, config, n: int, split: int, own_tail: int, map_split: bool = DEFAULT_MAP_SPLIT) -> int:
        return cost_matched_tail(config, n, split, self.target_macs(config, n, split, own_tail, map_split))

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


class Arm:
    """The parts of one resolved `RidgeFillArm` wired into one engine call per prompt."""

    def __init__(self, model: nn.Module, tokenizer: Any, spec: Any, *, resources: dict[str, Any] | None = None):
        self.model, self.tokenizer, self.resources = model, tokenizer, resources or {}
        self.selector = spec.selector_obj
        self.corrections = spec.correction_objs
        self.splice = spec.splice
        self.cost_match = spec.cost_match_obj
        self.knob = spec.knob(model.config)  # `budget=`: the tail, selected rows or split it sets per length

    @property
    def batches(self) -> bool:
        """True when prompts of one length can share an engine call: no part of the arm is per prompt
        (a selector's rows, a correction's or splice's reference)."""
        return self.selector is None and not self.corrections and self.splice is None

    def plan_for(self, plan: Plan, n: int) -> Plan:
        """`plan` for an n-token prompt: a budget's tail or split, or a cost-matched control's tail, is set by n."""
        if self.knob is not None and self.knob.name in ("tail", "split"):
            return dataclasses.replace(plan, **{self.knob.name: self.knob.setting(n)})
        if self.cost_match is None:
            return plan
        tail = self.cost_match.tail_for(self.model.config, n, plan.split, plan.tail, plan.map_split)
        return dataclasses.replace(plan, tail=tail)

    def row_budget(self, n: int) -> int | None:
        """The selected rows a budget grants an n-token prompt (None: the selector counts its own)."""
        return self.knob.setting(n) if self.knob is not None and self.knob.name == "rows" else None

    def knob_value(self, n: int) -> int | None:
        """The value the budget's knob takes at n tokens (None without a budget)."""
        return None if self.knob is None else self.knob.setting(n)

    def prefill(self, input_ids: torch.Tensor, plan: Plan, fill, row_budget: int | None = None) -> PrefillResult:
        """Run `plan` (already the prompt's: see `plan_for`) with this arm's selector, corrections and splice;
        `row_budget`: the rows a budget grants the selector (`row_budget`)."""
        select, capture = self.selector, None
        if isinstance(self.selector, Selector):
            req = Request(self.model, self.tokenizer, input_ids, plan, fill, self.resources)
            req.row_budget = row_budget
            wanted = self.selector.captures(req)
            req.capture_start = {layer: start for layer, (start, _) in wanted.items()}
            capture = {layer: slice(start, stop) for layer, (start, stop) in wanted.items()} or None
            selector = self.selector

            def select(ctx):
                return selector.select(req.attach(ctx))

        hooks = build_hooks(self.corrections, self.splice, self.model, input_ids)
        if plan.fill != FILL_OFF and not isinstance(fill, RowFill):  # the engine takes strategies, not names
            fill = fill_method(plan.fill).row_fill(fill)
        return engine.prefill(self.model, input_ids, plan, fill=fill, select=select, capture=capture, hooks=hooks)
