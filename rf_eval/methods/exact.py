"""`exact`: the stock model's own prefill of every prompt (the reference every arm is paired with).

Every prompt is plain: the shells run the unmodified model's code path, so an
exact run is lm-eval's `hf` model, bitwise. It is also the `reference=exact`
pass beside any method's arm, and the method whose forward context the engine
floor is measured under (a fill that replaced the model's forward pauses)."""

from __future__ import annotations

from typing import Any

import torch

from rf_eval.cost.mac_model import cache_rows, prefill_macs
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import PrefillResult, plain_prefill
from rf_eval.methods.base import Method, PromptPlan
from rf_eval.methods.requests import check_prompt


class Exact(Method):
    """The stock model's prefill; see the module docstring."""

    name = "exact"

    def plan(self, n: int) -> PromptPlan:
        return PromptPlan(n, plain=True, exact_tail=n)

    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        with self.forward_context():
            return plain_prefill(self.model, check_prompt(input_ids, self.model).to(self.device))

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        config = self.model.config
        macs, rows = prefill_macs(config, n), cache_rows(config, n)
        return PrefillCost(n, macs, macs, n, rows, rows, 1.0)

    def speedup_ceilings(self, n: int, plan: Any = None) -> dict[str, float]:
        return {"ceiling": 1.0, "mac_ceiling": 1.0}
