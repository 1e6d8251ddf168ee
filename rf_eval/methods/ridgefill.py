"""`ridgefill`: late layers' filled rows predicted from a split layer's states (`rf_eval.ridgefill.api.RidgeFill`).

Run by `--model ridgefill` (`rf_eval.model_adapters.ridgefill`), which loads its maps."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoConfig

from rf_eval.errors import UserError
from rf_eval.fills import arm_fills, fill_method
from rf_eval.mac_model import prefill_macs
from rf_eval.methods.base import MapsSplit, Method
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.arm_spec import RidgeFillArm


class RidgeFillMethod(Method):
    name = "ridgefill"
    Arm = RidgeFillArm
    keys = ("maps",)
    model = "ridgefill"

    @classmethod
    def missing_fields(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        """`fill`, unless a preset sets it (`RidgeFillArm.required`)."""
        if "fill" in fields or "fill" not in RidgeFillArm.required(dict(fields)):
            return {}
        return {"fill": " | ".join(arm_fills())}

    @classmethod
    def reads_study_maps(cls, model_args: Mapping[str, Any]) -> bool:
        """A fill method that reads maps (ridge)."""
        fill = model_args.get("fill")
        return fill in arm_fills()[1:] and fill_method(fill).needs_maps

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, *, maps: Any = None, **parts: Any) -> Any:
        return RidgeFill(model, tokenizer, arm=arm, maps=maps, **parts)

    @staticmethod
    def planned_arm(config: Any, arm: RidgeFillArm, maps_split: MapsSplit) -> RidgeFillArm:
        """`arm` resolved as its run resolves it (defaults, a preset's split) but without maps: a split the
        maps would set is `maps_split`'s, by the arm's own rule (`RidgeFillArm.split_for`)."""
        try:
            return arm.resolve(config)
        except (ValueError, UserError):  # needs its maps (fill=ridge): at the split they have
            return dataclasses.replace(arm, split=arm.split_for(config, maps_split(arm.split)))

    @classmethod
    def planned_costs(cls, config: Any, arm: RidgeFillArm, lengths: Sequence[int], *,
                      maps_split: MapsSplit) -> dict[int, tuple[float, str | None]]:
        """The MAC model's cost (paper section 2.5) at each length, at the value the budget's knob takes there."""
        spec = cls.planned_arm(config, arm, maps_split)
        knob = spec.knob(config)
        out: dict[int, tuple[float, str | None]] = {}
        for n in lengths:
            if knob is not None:
                setting = knob.setting(n)
                out[n] = (knob.fraction(n, setting), f"{knob.name} {setting}")
            elif not spec.fills_rows:
                out[n] = (1.0, None)
            else:
                filled = prefill_macs(config, n, split=spec.split, tail=min(spec.tail, n), fill=spec.fill,
                                      map_split=spec.map_split)
                out[n] = (filled / prefill_macs(config, n), None)
        return out

    @classmethod
    def check_budget(cls, model_args: Mapping[str, Any], arm: RidgeFillArm, lengths: Sequence[int] | None, *,
                     maps_split: MapsSplit) -> None:
        try:
            config = AutoConfig.from_pretrained(model_args["pretrained"])
        except OSError:  # a config not readable here: the run checks the budget once it loads
            return
        cls.planned_arm(config, arm, maps_split).knob(config).check_reachable(lengths)
