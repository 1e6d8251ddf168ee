"""`RidgeFill`: late layers' filled rows predicted from a split layer's states (RidgeFill paper, section 2).

The arm is a `RidgeFillArm` (`rf_eval.ridgefill.arm_spec`): give it as `arm=`, or its fields as keyword
arguments (`fill=`, `split=`, `tail=`, ...). `maps`: a `RidgeMaps`, or a folder or file written by `rf-eval
fit` (needed for fill `ridge`). The arm is resolved against the model's config and the maps once: before the
weights load when a shell prepares it (`prepare`), else here; with the weights in, only the maps' weights
fingerprint is checked. Its fill is bound to the model once: every prompt runs the same row-fill strategy
(`rf_eval.engine.rowfill.RowFill`). Per prompt, `plan(n)` decides once what runs (`PromptPlan.setting`: the
engine plan at n, a budget's tail or rows, a cost-matched control's tail); `prefill` and `prefill_cost` read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from rf_eval import engine
from rf_eval.cost.mac_model import ceiling_r, prefill_macs
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import PrefillResult
from rf_eval.errors import UserError
from rf_eval.fields import ArmError
from rf_eval.fills import arm_fills, fill_named
from rf_eval.fills.base import check_model_forward
from rf_eval.fills.loading_report import check_loaded
from rf_eval.methods import METHODS
from rf_eval.methods.base import MapsSplit, Method, ModelSource, PromptPlan
from rf_eval.methods.requests import check_prompt, model_identity
from rf_eval.ridge.maps import MapError, RidgeMaps, load_arm_maps
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_cost import planned_rows, ridgefill_prefill_cost, selector_probe_rows
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.presets import PRESET_FIELDS, Preset
from rf_eval.sparse.fill_part import exact_layers_sparse, with_sparse_savings


class RidgeFill(Method):
    """RidgeFill over one model; see the module docstring."""

    name = "ridgefill"
    Arm = RidgeFillArm
    loads = ("maps",)
    budget_knob = "the tail (the selected rows, with a selector that counts rows)"

    def __init__(self, model: nn.Module, tokenizer: Any = None, arm: RidgeFillArm | None = None, *,
                 maps: RidgeMaps | str | Path | None = None, **fields: Any):
        if arm is None:
            arm = self.parse_arm(fields, what=type(self).__name__)
        elif fields:
            raise TypeError(f"give arm= or the arm's fields, not both (got {', '.join(fields)})")
        if maps is not None and not isinstance(maps, RidgeMaps):
            maps = load_arm_maps(maps, arm.split)
        super().__init__(model, tokenizer, arm, **({} if maps is None else {"maps": maps}))
        self.maps = maps
        if not arm.resolved_for(model.config):  # the Python API: a shell resolved it before the weights
            arm = self.arm = arm.resolve(model.config, maps)
        if maps is not None:  # the one rule that needs the weights (a MapError)
            maps.check_weights(self.weights_sha256, allow_other_weights=arm.allow_other_weights)
        try:
            check_model_forward(model, arm.fill)
            check_loaded(model, arm.fill)
            fill = arm.fill_obj
            placed = maps.on_host() if maps is not None and arm.maps_device == "cpu" else maps
            #: the fill function (None: exact, nofill) and the engine's row-fill strategy, made once
            self.fill_fn = None if fill is None else fill.bind(model, placed)
            self.row_fill = None if fill is None else fill.row_fill(self.fill_fn)
        except ValueError as err:
            raise ArmError(str(err)) from None
        self.resources = {"unigram": arm.unigram} if arm.unigram else {}
        self.forward_fill = arm.fill
        #: the exact layers' sparse-attention method, made once (`rf_eval.sparse.fill_part`)
        self.sparse = None if arm.sparse_obj is None else arm.sparse_obj.bind(model, tokenizer)

    # -- before the weights --------------------------------------------------------------------
    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> RidgeFillArm:
        return RidgeFillArm.from_fields(dict(values), what=what)

    @classmethod
    def required_loads(cls, arm: RidgeFillArm) -> tuple[str, ...]:
        """None: the arm's fill says whether it reads maps (`resolve` names a missing one)."""
        return ()

    @classmethod
    def prepare(cls, arm: RidgeFillArm, source: ModelSource) -> tuple[RidgeFillArm, dict[str, Any]]:
        """The arm resolved against the config and its maps, read here (`RidgeFillArm.resolve`)."""
        path = source.files.get("maps")
        try:
            maps = load_arm_maps(path, arm.split) if path is not None else None
            return arm.resolve(source.config, maps), {"maps": maps}
        except MapError as err:
            raise ArmError(f"maps={path!r}: {err}") from err

    @classmethod
    def alias(cls, args: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """`preset=NAME` of a preset that is a method of its own (`PresetMethod`: pop, fastkv) is that method,
        which refuses the fields the preset sets."""
        preset = args.get("preset")
        if preset in (None, "") or preset not in METHODS or not issubclass(METHODS[preset], PresetMethod):
            return None
        given = [k for k in PRESET_FIELDS if k in args]
        if given:
            raise ArmError(f"preset={preset} sets fill, tail and split; leave out {', '.join(given)}")
        return str(preset), {k: v for k, v in args.items() if k != "preset"}

    @classmethod
    def missing_fields(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        """`fill`, unless a preset sets it."""
        if "fill" in fields or "fill" not in RidgeFillArm.required(dict(fields)):
            return {}
        return {"fill": " | ".join(arm_fills())}

    @classmethod
    def budget_refusal(cls, arm: RidgeFillArm) -> str | None:
        return arm.budget_refusal()

    def updated_arm(self, fields: Mapping[str, Any], *, what: str = "rf_arm") -> RidgeFillArm:
        return self.arm.updated(dict(fields), self.model.config, self.maps, what=what)

    # -- per prompt ----------------------------------------------------------------------------
    def plan(self, n: int) -> PromptPlan:
        """The engine plan at n tokens (a budget's or a cost-matched control's tail, a budget's rows), plain when
        no row is filled: the tail covers the prompt, or a selector's count takes every prefix row (FastKV)."""
        plan, rows, knob = self.arm.plan_at(n)
        selector, chosen = self.arm.selector_obj, planned_rows(self.arm, n)
        plain = plan.chunk_size is None and not self.cuts_cache(n) and (plan.fills_no_row(n) if selector is None
                 else chosen is not None and chosen >= n - min(plan.tail, n) and self.arm.sparse_obj is None)
        return PromptPlan(n, plain, n if plain else min(plan.tail, n), (plan, rows), knob)

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        """Prefill a 1 x N prompt; `.cache` is the model's own cache, `.logits` the last row's.

        A prompt held back by k tokens (k = 1 for generation, which `generate` then runs) runs the whole
        prompt's plan with the tail shortened by k, so every row keeps the class it has in a prefill of the
        whole prompt. A generation prefill at tail 1 runs no tail row: the held-back last token is the tail
        (POP's one-token tail, paper sections 6.4 and 7). An arm with a row selector reads the whole prompt
        for generation too (`reads_whole_prompt`): a selector that reads the prompt's last rows (attention,
        probe, FastKV's window) then reads the same rows as for scoring, and the cache gives back the last
        row, which `generate` runs."""
        ids = check_prompt(input_ids, self.model).to(self.device)
        whole = for_generation and self.reads_whole_prompt
        k = 0 if whole else 1 if for_generation else int(held_back)
        plan = plan if plan is not None else self.plan(ids.shape[1] + k)
        with self.forward_context():
            if plan.plain:
                return engine.plain_prefill(self.model, ids[:, :-1] if whole else ids)
            result = self.after_prefill(self._run(ids, self._held_back(plan, k, for_generation)), ids)
        return engine.without_last_row(result) if whole else result

    @property
    def reads_whole_prompt(self) -> bool:
        """Whether a generation prefill reads the whole prompt (then gives back its last row): an arm with a row
        selector, on a model whose every layer's cache can give a row back (no recurrent or sliding layer)."""
        return self.arm.selector_obj is not None and engine.rows_can_be_given_back(self.model.config)

    def after_prefill(self, result: PrefillResult, ids: torch.Tensor) -> PrefillResult:
        """What the method does to the cache of a prefill of `ids` before it is used (FastKV's capacity)."""
        return result

    def cuts_cache(self, n: int) -> bool:
        """Whether `after_prefill` changes an n-token prompt's cache (FastKV's capacity): never a plain prompt."""
        return False

    def prefills_together(self, n: int) -> bool:
        """Plain prompts, as every method's, and an arm with no per-prompt part (`RidgeFillArm.batches`)."""
        return self.arm.batches or super().prefills_together(n)

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False,
                      plan: PromptPlan | None = None) -> list[PrefillResult]:
        """One engine call when the arm has no per-prompt part (`RidgeFillArm.batches`) and the prompts have
        filled rows, else one prefill each."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a B x N tensor of prompts of one length, got "
                             f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids)}")
        k = int(for_generation and not self.reads_whole_prompt)
        plan = plan if plan is not None else self.plan(input_ids.shape[1] + k)
        if len(input_ids) == 1 or not self.arm.batches or plan.plain:
            return super().prefill_batch(input_ids, for_generation=for_generation, plan=plan)
        for row in input_ids:
            check_prompt(row[None], self.model)
        with self.forward_context():
            return engine.split_batch(self._run(input_ids.long().to(self.device), self._held_back(plan, k, True)))

    @staticmethod
    def _held_back(plan: PromptPlan, k: int, for_generation: bool) -> PromptPlan:
        """The whole prompt's plan for its first n - k rows: the tail shortened by k."""
        engine_plan, rows = plan.setting
        if not k:
            return plan
        shorter = dataclasses.replace(engine_plan, tail=max(engine_plan.tail - k, 0 if for_generation else 1))
        return dataclasses.replace(plan, setting=(shorter, rows))

    def _run(self, input_ids: torch.Tensor, plan: PromptPlan) -> PrefillResult:
        """One engine call: the arm's parts and its row-fill strategy, both bound once."""
        engine_plan, rows = plan.setting
        with exact_layers_sparse(self.sparse, input_ids.shape[1], engine_plan.split) as record:
            result = prefill_arm(self.model, self.tokenizer, self.arm, input_ids, engine_plan, self.row_fill,
                                 resources=self.resources, row_budget=rows)
        result.attention = record if record.pairs else None
        return result

    def speedup_ceilings(self, n: int, plan: PromptPlan | None = None) -> dict[str, float]:
        """`ceiling`, 1/r of layer passes, and `mac_ceiling`, the MAC model's (where it knows the family), at
        the exact rows the prompt runs (tail and selected rows); none where the selected rows or the lower
        layers' sparse pattern depend on the text (`RidgeFillArm.planned_rows`, `sparse=`)."""
        plan = plan if plan is not None else self.plan(n)
        if plan.plain:
            return {"ceiling": 1.0, "mac_ceiling": 1.0}
        engine_plan, _ = plan.setting
        selected = planned_rows(self.arm, n)
        if selected is None or self.sparse is not None:
            return {}
        exact_rows = min(engine_plan.tail + selected, n)
        out = {"ceiling": 1.0 / ceiling_r(len(engine.decoder_layers(self.model)), engine_plan.split, exact_rows, n)}
        try:
            out["mac_ceiling"] = self.prefill_cost(n, plan=plan).mac_speedup
        except (ValueError, AttributeError, TypeError):  # a family the MAC model does not know
            pass
        return out

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """By the MAC model (paper section 2.5) at the rows `result` ran (its prompt minus the tokens held back,
        which run as tail rows); a plain prompt's, or no `result`: the plan's rows."""
        plan = plan if plan is not None else self.plan(n)
        if result is None or result.plan is None:  # a filled prefill's result has the engine plan that ran
            ran = plan.setting[0]
            tail, selected = (n, 0) if plan.plain else (ran.tail, planned_rows(self.arm, n) or 0)
        else:
            ran = result.plan
            # tokens held back run as tail rows; a last row the prefill ran and gave back (`without_last_row`,
            # among `exact_rows`) is counted once
            ran_last = bool((result.exact_rows == result.prompt_length).any()) if result.prompt_length < n else False
            tail = min(ran.tail + n - result.prompt_length - ran_last, n)
            selected = max(int(result.exact_rows.numel()) - min(ran.tail, result.prompt_length), 0)
        cost = ridgefill_prefill_cost(self.model.config, n, split=ran.split, tail=tail, selected=selected,
                                      fill=self._cost_fill, map_split=ran.map_split,
                                      probe_rows=selector_probe_rows(self.arm.selector_obj))
        cost = with_sparse_savings(cost, self.model.config, result)  # the exact layers' `sparse=` attention
        if self.arm.budget is None:
            return cost
        return dataclasses.replace(cost, budget=self.arm.budget, knob_value=plan.knob_value)

    @property
    def _cost_fill(self) -> Any:
        """What the MAC model reads of the arm's fill: its object, bound once (the name for the exact arm)."""
        return self.arm.fill_obj if self.arm.fill_obj is not None else self.arm.fill

    # -- what results record -------------------------------------------------------------------
    def provenance(self) -> dict[str, Any]:
        """What ran: the arm (fill, split, tail, parts) and the maps' identity."""
        info = {"method": self.name, **self.arm.describe(), **model_identity(self.model, self.weights_sha256, self.maps)}
        if self.arm.allow_other_weights:
            info["allow_other_weights"] = True
        return info

    @classmethod
    def run_facts(cls, arm: RidgeFillArm) -> dict[str, Any]:
        """The arm's tail (the filled region's edge) and whether it fills rows."""
        return {"tail": arm.tail, "fills_rows": arm.fills_rows}

    def floor_split(self) -> int:
        return max(int(self.arm.split), 1)

    # -- a study's preview ---------------------------------------------------------------------
    @classmethod
    def reads_study_maps(cls, model_args: Mapping[str, Any]) -> bool:
        """A fill that reads maps (ridge)."""
        fill = model_args.get("fill")
        return fill in arm_fills()[1:] and fill_named(fill).needs_maps

    @staticmethod
    def previewed_arm(config: Any, arm: RidgeFillArm, maps_split: MapsSplit) -> RidgeFillArm:
        """`arm` resolved as its run resolves it but without maps: a split the maps would set is
        `maps_split`'s, by the arm's own rule (`RidgeFillArm.split_for`)."""
        try:
            return arm.resolve(config)
        except (ValueError, UserError):  # needs its maps (fill=ridge): at the split they have
            return dataclasses.replace(arm, split=arm.split_for(config, maps_split(arm.split)))

    @classmethod
    def preview_costs(cls, config: Any, arm: RidgeFillArm, lengths: Sequence[int], *,
                      maps_split: MapsSplit) -> dict[int, tuple[float, str | None]]:
        """The MAC model's cost (paper section 2.5) at each length, at the value the budget's knob takes there."""
        previewed = cls.previewed_arm(config, arm, maps_split)
        knob = previewed.knob(config)
        out: dict[int, tuple[float, str | None]] = {}
        for n in lengths:
            if knob is not None:
                setting = knob.setting(n)
                out[n] = (knob.fraction(n, setting), f"{knob.name} {setting}")
            elif not previewed.fills_rows:
                out[n] = (1.0, None)
            else:
                rows = planned_rows(previewed, n)
                filled = prefill_macs(config, n, split=previewed.split, tail=min(previewed.tail, n),
                                      exact_rows=rows or 0, fill=previewed.fill_obj, map_split=previewed.map_split,
                                      probe_rows=selector_probe_rows(previewed.selector_obj))
                out[n] = (filled / prefill_macs(config, n),
                          f"rows {rows}" if rows else None if rows == 0 else "+ the rows the selector picks")
        return out

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: RidgeFillArm, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model_args["pretrained"])
        except OSError:  # a config not readable here: the run checks the budget once it loads
            return
        cls.previewed_arm(config, arm, maps_split).knob(config).check_reachable(lengths)


class PresetMethod(RidgeFill):
    """A published configuration of RidgeFill's engine as a method of its own, `preset=NAME` too
    (`rf_eval.ridgefill.presets`): its `settings` set fill, tail and split; an arm sets the rest of `own_fields`."""

    preset: ClassVar[str] = ""
    settings: ClassVar[Preset]
    loads = ()
    #: the `RidgeFillArm` fields an arm of the method may set
    own_fields: ClassVar[tuple[str, ...]] = ("selector", "chunk_size", "budget")

    @classmethod
    def arm_fields(cls) -> tuple[str, ...]:
        return cls.own_fields

    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> RidgeFillArm:
        unknown = [k for k in values if k not in cls.own_fields]
        if unknown:
            raise ArmError(f"unknown {what} key(s) of method={cls.name}: {', '.join(map(repr, unknown))}; valid keys: "
                           f"{', '.join(cls.own_fields)} (preset={cls.preset} sets fill, tail and split)")
        return RidgeFillArm.from_fields({**values, "preset": cls.preset}, what=what)

    @classmethod
    def missing_fields(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        return {}

    @classmethod
    def reads_study_maps(cls, model_args: Mapping[str, Any]) -> bool:
        return False
