"""`RidgeFillArm`: one RidgeFill arm, written once, checked once.

Every entry point builds the same frozen spec: lm-eval `model_args`
(`--model ridgefill`), `rf-eval` CLI flags, a served request's `rf_arm`, and
Python keyword arguments (`RidgeFill(model, fill="ridge", ...)`), through
`RidgeFillArm.from_fields`. Construction owns every rule that needs no model
(valid names, ranges, which parts go with which fill) and parses the
selector, correction and cost-match specs once; `resolve` owns every rule
that needs the model's config and the maps (the split's range and default,
maps made for this model and split, a terminal-state table made for this
arm, the unigram table beside the maps). Nothing below it re-checks.

The arm is bound once: construction turns the `fill` name into its fill
(`fill_obj`, one instance per arm) and the selector, correction and cost-match
strings into their objects; `resolve` adds the engine plan and the budget's
knob. The method (`rf_eval.ridgefill.method.RidgeFill`) and the engine read
those objects; nothing looks a plug-in up by name after this module.

Arms (RidgeFill paper, table 3 and section 3.3): `fill` exact | nofill |
identity | ridge; `split` S; `tail` T; optional exact prefix rows from a
`selector` (section 2.4), `corrections` (section 2.3), a `splice` (section
6.6), a `sparse` attention pattern in the exact layers (`rf_eval.sparse.fill_part`)
and, on a `nofill` control, `cost_match` (the tail lengthened to the
MAC cost of the named arm), or a `preset` that sets fill, tail and split
together (`rf_eval.ridgefill.presets`: `pop`). `map_split` (default false,
`rf_eval.engine.plan.DEFAULT_MAP_SPLIT`): filled rows of layer S read x_S,
which is exact; true: they read x̂_S = A_S x_S + b_S, as the paper's released
maps and MAC counts have it (section 2.2 "Size and cost"); identity is the
same either way.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rf_eval.cost.budget import check_budget
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT, DEFAULT_TAIL, Plan, check_rows, check_split
from rf_eval.fields import ArmError, build
from rf_eval.fills import FILL_OFF, absent_fills, arm_fills, fill_named, predicting_fills
from rf_eval.ridge.maps import config_hash
from rf_eval.ridgefill.arm import arm_parts, describe_arm
from rf_eval.ridgefill.arm_cost import knob_name, ridgefill_knob
from rf_eval.ridgefill.presets import PRESET_FIELDS, preset
from rf_eval.sparse.fill_part import check_fill

SPLICES = ("keys", "values", "both")
MAPS_DEVICES = ("model", "cpu")
#: The exact tail's length when an arm does not name one.


@dataclass(frozen=True, kw_only=True)
class RidgeFillArm:
    """One RidgeFill arm; see the module docstring. Selector, correction and cost-match strings use the grammar of `rf_eval.arm_string`."""

    fill: str = FILL_OFF
    split: int | None = None  # None: the maps' split, else L // 2 (set by `resolve`)
    tail: int = DEFAULT_TAIL
    chunk_size: int | None = None
    #: a spec (`attention(share=0.1)+special`), a dict, a `Selector` or a callable `(PrefillContext) -> rows`
    selector: Any = None
    corrections: Any = None  # `value_rescale(c=512)+terminal_state(path=F)`, or a list of specs/objects
    splice: str | None = None
    cost_match: Any = None  # `ridge(tail=4096;exact_share=0.1)`, a dict or a CostMatch
    sparse: Any = None  # the exact layers' sparse attention: `flexprefill(gamma=0.9)` (`rf_eval.sparse.fill_part`)
    unigram: str | None = None  # the protected-token selectors' table (default: beside the maps)
    map_split: bool = DEFAULT_MAP_SPLIT  # True: layer S's filled rows read the map's x̂_S (paper's release), not x_S
    #: use maps fitted on other weights (a deliberate transfer); by default `resolve` refuses them
    allow_other_weights: bool = False
    #: where the maps live: "model" (on each layer's device) or "cpu" (host memory, each layer's map streamed
    #: to its device ahead of use: `rf_eval.ridge.maps.StreamedMaps`)
    maps_device: str = "model"
    #: a published configuration that sets fill, tail and split (`rf_eval.ridgefill.presets`)
    preset: str | None = None
    #: at most this share of exact prefill's MACs at each prompt length: the arm's knob (tail, selected rows,
    #: or a preset's split) is set per length to spend it (`rf_eval.ridgefill.arm_cost`, `rf_eval.cost.budget`)
    budget: float | None = None

    def __post_init__(self) -> None:
        if self.preset is not None:
            self._apply_preset()
        if self.fill not in arm_fills():
            raise ArmError(f"fill={self.fill!r} is not valid; valid fills: {', '.join(arm_fills())}")
        # the fill's one object for this arm: every rule and the engine read it, never the name again
        object.__setattr__(self, "_fill", None if self.fill == FILL_OFF else fill_named(self.fill))
        try:
            check_rows(self.tail, self.chunk_size)
            if self.split is not None:
                check_split(self.split, None)
        except ValueError as err:
            raise ArmError(str(err)) from None
        if self.maps_device not in MAPS_DEVICES:
            raise ArmError(f"maps_device={self.maps_device!r} is not valid; valid: {', '.join(MAPS_DEVICES)}")
        if self.maps_device != "model" and not (self.fill_obj and self.fill_obj.needs_maps):
            raise ArmError(f"maps_device={self.maps_device} places maps: fill={self.fill} reads none")
        if self.splice is not None and self.splice not in SPLICES:
            raise ArmError(f"splice={self.splice!r} is not valid; valid splices: {', '.join(SPLICES)}")
        if self.unigram is not None and not Path(self.unigram).is_file():
            raise ArmError(f"unigram={self.unigram!r}: no such file")
        parts = arm_parts(self)
        object.__setattr__(self, "_parts", parts)
        check_fill(parts["sparse"], self.fill_obj)
        if (parts["corrections"] or self.splice) and not (self.fill_obj and self.fill_obj.supports_corrections):
            raise ArmError(f"corrections and splice change filled rows: they need a fill from predicted inputs "
                           f"({', '.join(predicting_fills())}), not fill={self.fill}")
        if parts["selector"] is not None and self.fill_obj is not None and not self.fill_obj.selects_rows:
            raise ArmError(f"fill={self.fill} has no exact prefix rows to select: leave out selector=")
        if parts["cost_match"] is not None and not (self.fill_obj and self.fill_obj.absent):
            raise ArmError(f"cost_match lengthens the tail of an arm without filled rows: it needs fill="
                           f"{' or '.join(absent_fills())}, not fill={self.fill}")
        check_budget(self.budget)
        refusal = self.budget_refusal() if self.budget is not None else None
        if refusal is not None:
            raise ArmError(f"budget={self.budget:g}: {refusal}")

    def budget_refusal(self) -> str | None:
        """Why this arm cannot take a budget (None: it can), the one rule for it: a fill to set the knob of, no
        second cost rule, a selector that counts its rows, a split the maps do not fix."""
        if self.fill_obj is None:
            return ("a budget sets the knob of a fill; the exact arm (fill=exact) spends exact prefill's MACs: "
                    "leave out budget or give a fill")
        if self.cost_match_obj is not None:
            return "give budget or cost_match, not both: each sets the arm's tail by a cost"
        selector = self.selector_obj
        if selector is not None and not getattr(selector, "counts_rows", False):
            return (f"a budget turns a row selector's count, and selector={self.selector!r} chooses its rows by "
                    "a rule, not a count; give a selector that counts rows (attention, random, probe) or leave "
                    "out the selector to turn the tail")
        if knob_name(self.preset, selector) == "split" and self.fill_obj.needs_maps:
            return f"a budget turns preset={self.preset}'s split, which its maps fix"
        return None

    def _apply_preset(self) -> None:
        try:
            chosen = preset(self.preset)
        except ValueError as err:
            raise ArmError(str(err)) from None
        # (the split is the preset's rule of the model's depth: `resolve` checks a given one against it)
        given = [f for f, default in (("fill", FILL_OFF), ("tail", DEFAULT_TAIL))
                 if getattr(self, f) not in (default, getattr(chosen, f))]
        if given:
            raise ArmError(f"preset={self.preset} sets fill, tail and split; leave out {', '.join(given)}")
        object.__setattr__(self, "fill", chosen.fill)
        object.__setattr__(self, "tail", chosen.tail)
        if chosen.selector is not None:
            if self.selector is None:
                object.__setattr__(self, "selector", chosen.selector)
            elif not str(getattr(self.selector, "name", self.selector)).startswith(chosen.selector):
                raise ArmError(f"preset={self.preset} runs selector {chosen.selector}; give it other parameters "
                               f"(selector={chosen.selector}(...)) or leave out selector=")

    @staticmethod
    def required(values: dict[str, Any]) -> tuple[str, ...]:
        """The fields an arm must name: its fill, unless a preset sets it."""
        return () if values.get("preset") not in (None, "") else ("fill",)

    @classmethod
    def from_fields(cls, values: dict[str, Any], *, what: str = "arm") -> RidgeFillArm:
        """The spec from loose values (strings from model_args or a request, or typed Python values)."""
        if values.get("preset") not in (None, ""):
            given = [k for k in PRESET_FIELDS if k in values]
            if given:
                raise ArmError(f"preset={values['preset']} sets fill, tail and split; leave out {', '.join(given)}")
        return build(cls, values, what=what)

    def updated(self, fields: dict[str, Any], model_config: Any, maps: Any = None, *, what: str = "arm"
                ) -> RidgeFillArm:
        """This (resolved) arm with `fields` applied and resolved again: a served request's arm.

        A `preset` among the fields replaces this arm's fill, tail and split; a
        fill, tail or split among them leaves this arm's preset. `maps` (the server's) are read only by a fill
        that reads maps: a preset's or another fill's arm runs at its own split.
        """
        merged = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if any(k in fields for k in PRESET_FIELDS) and not fields.get("preset"):
            merged.pop("preset", None)
        elif merged.get("preset") or fields.get("preset"):  # the preset (this arm's or a new one) sets them
            merged = {k: v for k, v in merged.items() if k not in PRESET_FIELDS}
        merged.update(fields)
        arm = RidgeFillArm.from_fields(merged, what=what)
        return arm.resolve(model_config, maps if arm.fill_obj is not None and arm.fill_obj.needs_maps else None)

    # -- the parsed parts ---------------------------------------------------------------
    @property
    def selector_obj(self) -> Any:
        """The selector (a `rf_eval.selectors.Selector` or a bare callable), or None."""
        return self._parts["selector"]

    @property
    def correction_objs(self) -> list:
        return self._parts["corrections"]

    @property
    def cost_match_obj(self) -> Any:
        return self._parts["cost_match"]

    @property
    def sparse_obj(self) -> Any:
        """The exact layers' sparse-attention part (`rf_eval.sparse.fill_part.SparsePart`), or None."""
        return self._parts["sparse"]

    @property
    def fills_rows(self) -> bool:
        """False for the exact arm (whose every prompt runs the plain model)."""
        return self.fill != FILL_OFF

    @property
    def fill_obj(self) -> Any:
        """The arm's fill (a `rf_eval.fills.Fill` instance, made once with the arm), None for the exact
        arm."""
        return self._fill

    # -- what a resolved arm runs -------------------------------------------------------
    @property
    def plan(self) -> Plan:
        """The engine plan of this resolved arm (its split, tail, fill, chunk size and map_split)."""
        bound = self.__dict__.get("_plan")
        if bound is None:
            raise ValueError("the arm has no plan before `resolve` gives it a model")
        return bound

    @property
    def batches(self) -> bool:
        """True when prompts of one length can share an engine call: no part of the arm is per prompt
        (a selector's rows, a correction's or splice's reference)."""
        return (self.selector_obj is None and not self.correction_objs and self.splice is None
                and self.sparse_obj is None)

    def plan_at(self, n: int) -> tuple[Plan, int | None, int | None]:
        """(the engine plan of an n-token prompt, the selected rows a budget grants it (None: the selector
        counts its own), the value the budget's knob took (None without one)): a budget's tail, split or rows,
        or a cost-matched control's tail, set by n. `RidgeFill.plan` asks once per prompt."""
        plan, knob = self.plan, self._knob
        value = None if knob is None else knob.setting(n)
        if knob is not None and knob.name in ("tail", "split"):
            return dataclasses.replace(plan, **{knob.name: value}), None, value
        if knob is not None:  # rows
            return plan, value, value
        if self.cost_match_obj is not None:
            tail = self.cost_match_obj.tail_for(self._config, n, plan.split, plan.tail, plan.map_split, self.fill_obj)
            plan = dataclasses.replace(plan, tail=tail)
        return plan, None, None

    def resolved_for(self, model_config: Any) -> bool:
        """Whether `resolve` bound this arm to a model of `model_config`'s shape (`config_hash`)."""
        config = self.__dict__.get("_config")
        return config is not None and config_hash(config) == config_hash(model_config)

    def _copy(self, **fields: Any) -> RidgeFillArm:
        """This arm with `fields` set, its parsed parts and fill kept (no second construction)."""
        out = copy.copy(self)
        for name, value in fields.items():
            object.__setattr__(out, name, value)
        return out

    def _bind(self, model_config: Any, knob: Any) -> None:
        """Hold what the resolved arm runs with: the model's config, its plan and its budget's knob."""
        object.__setattr__(self, "_config", model_config)
        object.__setattr__(self, "_knob", knob)
        object.__setattr__(self, "_plan", Plan(split=self.split, tail=self.tail, fill=self.fill,
                                               chunk_size=self.chunk_size, map_split=self.map_split))

    # -- rules that need the model ------------------------------------------------------
    def split_for(self, model_config: Any, maps_split: int | None = None) -> int:
        """The split this arm runs at on this model, checked: the maps' (`maps_split`), else a preset's, else
        the fill's default, else L/2 (an ArmError for a split that contradicts them or lies outside
        1..L-1). `resolve` takes it; `rf-eval study plan` costs arms by it before their maps exist."""
        n_layers = int(model_config.num_hidden_layers)
        split, given = self.split, "split=: leave it out"
        if maps_split is not None:
            if split is not None and split != maps_split:
                raise ArmError(f"split={split} contradicts the maps, fitted for split {maps_split}")
            split, given = maps_split, "the split of the maps given: leave out maps="
        if self.preset is not None:
            own = preset(self.preset).split(n_layers)
            if split not in (None, own):
                raise ArmError(f"preset={self.preset} splits this {n_layers}-layer model at {own}, not {split} "
                               f"({given})")
            split = own
        if split is None and self.fill_obj is not None:
            split = self.fill_obj.default_split(model_config)
        if split is None:
            split = n_layers // 2
        try:
            check_split(split, n_layers)
        except ValueError as err:
            raise ArmError(str(err)) from None
        if self.fill_obj is not None:
            self.fill_obj.check_split(model_config, split)
        return split

    def resolve(self, model_config: Any, maps: Any = None) -> RidgeFillArm:
        """This arm for one model (a `transformers` config) and its maps (`RidgeMaps` or None), before any
        weights load (the maps' weights fingerprint is the method's to check, with the weights in).

        Returns the arm with `split` (and `unigram`, when the maps' folder holds
        one) filled in; an `ArmError` for anything that does not fit (a
        `MapError` for maps that do not).
        """
        if maps is not None:
            maps.check_model(model_config)  # a MapError naming both config hashes
        if self.fill_obj is not None:
            self.fill_obj.check(model_config, maps)
        split = self.split_for(model_config, maps.split if maps is not None else None)
        unigram = self.unigram
        beside = getattr(maps, "path", None)
        if unigram is None and beside is not None and (Path(beside).parent / "unigram.safetensors").is_file():
            unigram = str(Path(beside).parent / "unigram.safetensors")
        arm = self._copy(split=split, unigram=unigram)
        check = getattr(arm.selector_obj, "check_layers", None)
        if check is not None:
            try:
                check(model_config, split)
            except ValueError as err:
                raise ArmError(f"selector={self.selector!r}: {err}") from None
        maps_sha = maps.sha256() if maps is not None else ""
        for correction in arm.correction_objs:
            if hasattr(correction, "check"):
                try:
                    correction.check(config_hash(model_config), arm, maps_sha)
                except ValueError as err:
                    raise ArmError(f"corrections: {err}") from None
        knob = arm.knob(model_config)
        if knob is not None:
            knob.check_reachable()  # a BudgetError naming the cheapest fraction, before any weights load
        arm._bind(model_config, knob)
        return arm

    def knob(self, model_config: Any) -> Any:
        """The knob `budget=` turns on this (resolved) arm on a model of `model_config`, a `rf_eval.cost.budget.Knob`
        (None without a budget)."""
        return ridgefill_knob(self, model_config)

    def describe(self) -> dict[str, Any]:
        """What results record about the arm (parts by name and parameters): `describe_arm`."""
        return describe_arm(self)
