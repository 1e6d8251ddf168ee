"""`gemfilter`: an early layer's attention keeps k rows, the model reruns on them (`rf_eval.drop.gemfilter`).

Run by `--model drop` (`rf_eval.model_adapters.drop`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rf_eval.drop.arm_spec import DropArm
from rf_eval.drop.gemfilter import GemFilter
from rf_eval.methods.base import Method


class GemFilterMethod(Method):
    name = "gemfilter"
    Arm = DropArm
    model = "drop"
    budget_sets = ("keep", "keep_share")

    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> Any:
        return super().parse_arm({"method": cls.name, **values}, what=what)

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, **parts: Any) -> Any:
        return GemFilter(model, tokenizer, arm=arm, **parts)
