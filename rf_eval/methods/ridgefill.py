"""`ridgefill`: late layers' filled rows predicted from a split layer's states (`rf_eval.ridgefill.api.RidgeFill`).

Run by `--model ridgefill` (`rf_eval.model_adapters.ridgefill`), which loads its maps."""

from __future__ import annotations

from typing import Any

from rf_eval.methods.base import Method
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.arm_spec import RidgeFillArm


class RidgeFillMethod(Method):
    name = "ridgefill"
    Arm = RidgeFillArm
    keys = ("maps",)
    model = "ridgefill"

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, *, maps: Any = None, **parts: Any) -> Any:
        return RidgeFill(model, tokenizer, arm=arm, maps=maps, **parts)
