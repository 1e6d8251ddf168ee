"""FastKV (Jo et al., 2025), as a method of its own: `method=fastkv`.

Every row runs layers 0..T (the TSP layer, L/2 - 1) and writes its cache
there; the TSP layer's last 8 rows (the window) attend over the prompt, and
only the top `keep` rows (2,048 with the window, the authors' `tsp_len`) run
the layers above, whose caches hold only them. In RidgeFill's engine that is
the arm of `preset=fastkv` (`rf_eval.ridgefill.presets`): fill `nofill`, split
L/2, tail 8 (the window), the row rule `selector=tsp(...)`
(`rf_eval.selectors.tsp`, where the authors' code is cited); `budget=` turns
the propagated rows. A prompt of at most `keep` rows runs the plain model
(every row propagates: the authors skip the selection). After the prefill every
layer's cache is cut to the selector's capacity (2,048 rows per key-value head, `capacity=none` for the
propagation alone: `rf_eval.drop.fastkv_capacity`). The defaults are the
authors' May 2025 release's (`RELEASE`); their current scripts' max pooling and
proportional mode are the selector's `pooling=max`, `keep_share=0.2` and
`capacity_share=0.1`. `--model ridgefill --model_args preset=fastkv` names this
method too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rf_eval import engine
from rf_eval.cost.mac_model import cache_rows
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.drop.fastkv_capacity import compress_to_capacity
from rf_eval.engine import PrefillResult
from rf_eval.fills.nofill import NoFill
from rf_eval.methods.base import PromptPlan
from rf_eval.ridgefill.method import PresetMethod
from rf_eval.ridgefill.presets import Preset

__all__ = ["RELEASE", "FastKV"]

#: the release whose defaults the arm follows (its provenance records it)
RELEASE = ("dongwonjo/FastKV b6ca98a (May 2025), scripts/run_longbench.sh: tsp_idx L/2 - 1, tsp_len 2048, "
           "max_prompt 2048, window 8, avgpool kernel 7")


class FastKV(PresetMethod):
    """FastKV's token-selective propagation and per-layer KV capacity; see the module docstring."""

    name = "fastkv"
    preset = "fastkv"
    # the TSP layer T = 15 of Llama-3.1-8B's 32 (dongwonjo/FastKV's default): layers 0..T run every row, so the
    # split S = T + 1 = L / 2; the last 8 rows (its window) always propagate (`rf_eval.selectors.tsp`)
    settings = Preset(fill=NoFill.name, tail=8, split=lambda n_layers: n_layers // 2, selector="tsp", knob="rows")
    budget_knob = "the propagated rows"

    def capacity(self, n: int) -> int | None:
        """The rows per key-value head each layer's cache keeps after an n-token prefill (None: every row). A
        model with recurrent or sliding-window layers keeps its caches whole under the default capacity (the
        selector refuses any other on it): the cut reads and rewrites plain full-attention caches only."""
        return self.arm.selector_obj.capacity_at(n) if self.cuts_caches else None

    @property
    def cuts_caches(self) -> bool:
        return engine.rows_can_be_given_back(self.model.config)

    def cuts_cache(self, n: int) -> bool:
        """A capacity under the prompt's rows cuts its caches, so a prompt whose every row propagates (at most
        `keep` rows, where the authors skip the selection) is plain only within the capacity."""
        capacity = self.capacity(n)
        return capacity is not None and capacity < n

    def after_prefill(self, result: PrefillResult, ids: torch.Tensor) -> PrefillResult:
        capacity = self.capacity(ids.shape[1])
        if capacity is None:
            return result
        rule = self.arm.selector_obj
        return compress_to_capacity(self.model, result, ids, capacity, window=rule.window, kernel=rule.kernel,
                                    pooling=rule.pooling)

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """RidgeFill's count (the propagation's MACs; the capacity's scoring is not charged), its cache entries
        at most the capacity in every layer."""
        cost = super().prefill_cost(n, result, plan)
        capacity = self.capacity(n)
        if capacity is None or cost.exact_rows >= n:
            return cost
        split = (plan if plan is not None else self.plan(n)).setting[0].split
        kept = cache_rows(self.model.config, n, split=split, exact_rows=cost.exact_rows, fill=self.arm.fill_obj,
                          capacity=capacity)
        return dataclasses.replace(cost, cache_entries=kept)

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "release": RELEASE, "capacity_applied": self.cuts_caches}
