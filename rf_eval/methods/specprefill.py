"""`specprefill`: a speculator's attention keeps whole chunks, the target prefills them
(`rf_eval.drop.specprefill`).

Run by `--model drop` (`rf_eval.model_adapters.drop`), which loads the speculator (`source`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rf_eval.drop.arm_spec import DropArm
from rf_eval.drop.specprefill import SpeculativePrefill
from rf_eval.methods.base import Method


class SpecPrefillMethod(Method):
    name = "specprefill"
    Arm = DropArm
    keys = ("source",)
    model = "drop"
    budget_sets = ("keep", "keep_share")

    @classmethod
    def parse_arm(cls, values: Mapping[str, Any], *, what: str = "model_args") -> Any:
        return super().parse_arm({"method": cls.name, **values}, what=what)

    @classmethod
    def build(cls, model: Any, tokenizer: Any, arm: Any, *, source: Any = None, **parts: Any) -> Any:
        return SpeculativePrefill(model, source, tokenizer, arm=arm, **parts)
