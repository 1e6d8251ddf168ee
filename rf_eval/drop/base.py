"""What every token-dropping method shares: the prefill protocol around one rule, "which rows to keep".

A dropper (RidgeFill paper Table 1, section 7: a skipped token leaves no cache
entry) reads the whole prompt, keeps k of its N rows and prefills the model on
those alone. A method subclasses `Dropper` in a file of its own, with an `Arm`
that extends `DropperArm` (how many rows: `keep`, `keep_share` or `budget`),
and says
- `keep_count(n)`: the rows an n-token prompt keeps by its arm's settings;
- `keep_rows(ids, count)`: the kept rows of a 1 x N prompt (sorted), from its scores;
- `score_macs(n)`: the MACs of its scoring pass (`budget=` then sets the rows,
  or chunks, the rest of the budget pays for: `rf_eval.cost.budget`).

Keeping every row is the exact model: a prompt no longer than the rows kept is
the plain model's prefill, bitwise. A dropper reads the whole prompt, its last
token included, for a generation prefill as well (`reads_whole_prompt`: the
shells hand it the whole prompt and `generate` then runs the last kept row,
`rf_eval.methods.dropped.generation_inputs`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rf_eval.cost.budget import Knob, check_budget
from rf_eval.cost.mac_model import cache_rows, prefill_macs
from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.engine import PrefillResult, new_cache, plain_prefill
from rf_eval.fields import ArmError
from rf_eval.methods.base import Method, ModelSource, PromptPlan
from rf_eval.methods.dropped import DroppedResult
from rf_eval.methods.requests import check_prompt, meta_model

__all__ = ["Dropper", "DropperArm"]

#: the arm fields that each set the rows kept (one of them)
ROW_SETTINGS = ("keep", "keep_share", "budget")


@dataclass(frozen=True, kw_only=True)
class DropperArm:
    """How many rows a prompt keeps: `keep` (a count), `keep_share` (a share of its rows) or `budget` (a share
    of exact prefill's MACs: the rows, or chunks, set per prompt length to spend it)."""

    keep: int | None = None
    keep_share: float | None = None
    budget: float | None = None

    def __post_init__(self) -> None:
        given = [name for name in ROW_SETTINGS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ArmError(f"give one of keep, keep_share and budget, not {' and '.join(given)}: each sets the rows kept")
        if self.keep is not None and self.keep < 1:
            raise ArmError(f"keep={self.keep}: a dropper keeps at least 1 row")
        if self.keep_share is not None and not 0 < self.keep_share <= 1:
            raise ArmError(f"keep_share={self.keep_share!r} is not a share of the prompt's rows; give 0 < keep_share <= 1")
        check_budget(self.budget)


class Dropper(Method):
    """A token-dropping prefill method over one model; see the module docstring."""

    Arm: ClassVar[type] = DropperArm
    budget_sets = ("keep", "keep_share")
    #: renumbered: the kept rows run at positions 0..k-1 (else at their original positions)
    renumbered: ClassVar[bool] = False
    #: decoding goes on at the prompt's end, position N (else after the last kept row): `DroppedResult`
    continues_at_prompt_end: ClassVar[bool] = False
    #: the shells hand a generation prefill the whole prompt (the rule reads its last token)
    reads_whole_prompt: ClassVar[bool] = True
    #: what `budget=` turns, by name (`rf_eval.cost.budget.Knob`)
    knob_name: ClassVar[str] = "rows"

    def __init__(self, model: Any, tokenizer: Any = None, arm: Any = None, **given: Any):
        super().__init__(model, tokenizer, arm, **given)
        self.bind_model()
        positions = getattr(model.config, "max_position_embeddings", None) or 1 << 20
        self.knob = None if self.arm.budget is None else Knob(
            self.knob_name, float(self.arm.budget), self.macs, functools.partial(prefill_macs, model.config),
            lambda n: 1, self.knob_top, max_length=int(positions))
        if self.knob is not None:
            self.knob.check_reachable()

    @classmethod
    def prepare(cls, arm: Any, source: ModelSource) -> tuple[Any, dict[str, Any]]:
        """The method built once over models on the meta device (no weights): its rules for this model (a
        filter layer, a budget's reach, a speculator's layers), before anything loads."""
        cls.on_meta(arm, source)
        return arm, {}

    @classmethod
    def on_meta(cls, arm: Any, source: ModelSource) -> Dropper:
        second = cls.check_loads(arm, source)
        parts = {cls.second_model: meta_model(source, second)} if second else {}
        return cls(meta_model(source), None, arm, **parts)

    # -- what a method provides ---------------------------------------------------------
    def bind_model(self) -> None:
        """Check the arm against the model and keep what its rule reads (a filter layer, a speculator)."""

    def keep_count(self, n: int) -> int:
        """Rows an n-token prompt keeps, by the arm's settings (before a budget)."""
        raise NotImplementedError

    def keep_rows(self, ids: torch.Tensor, count: int) -> torch.Tensor:
        """The `count` kept rows of a 1 x N prompt, sorted."""
        raise NotImplementedError

    def score_macs(self, n: int) -> int:
        """MACs of the pass that scores an n-token prompt's rows."""
        raise NotImplementedError

    def knob_top(self, n: int) -> int:
        """The knob's largest value at n tokens (every row kept)."""
        return n

    def rows_of(self, n: int, value: int) -> int:
        """Rows kept at knob value `value` (the knob counts rows unless a method counts chunks)."""
        return min(value, n)

    # -- the protocol ---------------------------------------------------------------------
    def plan(self, n: int) -> PromptPlan:
        """The rows an n-token prompt keeps (the budget's, else the arm's settings): plain when every row is."""
        value = self.knob.setting(n) if self.knob is not None else None
        k = self.rows_of(n, value) if value is not None else min(self.keep_count(n), n)
        plain = k >= n
        return PromptPlan(n, plain, n if plain else 0, k, value)

    def macs(self, n: int, value: int) -> int:
        """An n-token prompt's prefill MACs at knob value `value`: the scoring pass and the prefill of the kept
        rows (causal among themselves), or exact's when every row is kept."""
        k = self.rows_of(n, value)
        if k >= n:
            return prefill_macs(self.model.config, n)
        return self.score_macs(n) + prefill_macs(self.model.config, k)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0,
                plan: PromptPlan | None = None) -> PrefillResult:
        """The prefill of a 1 x N prompt: the plain model's when every row is kept, else the kept rows' alone.
        `for_generation`: `input_ids` is the whole prompt (`reads_whole_prompt`); the cache then holds the
        kept rows but the last, which `generate` runs."""
        if held_back:
            raise ValueError(f"held_back={held_back}: {self.name} chooses its rows from the whole prompt")
        ids = check_prompt(input_ids, self.model).to(self.device)
        n = ids.shape[1]
        plan = plan if plan is not None else self.plan(n)
        with self.forward_context():
            if plan.plain:
                return plain_prefill(self.model, ids[:, :-1] if for_generation else ids)
            kept = self.keep_rows(ids, plan.setting).to(ids.device)
            positions = torch.arange(kept.numel(), device=ids.device) if self.renumbered else kept
            rows = kept[:-1] if for_generation else kept
            cache = new_cache(self.model)
            logits = None
            if rows.numel():
                out = self.model(input_ids=ids[:, rows], cache=cache, use_cache=True,
                                 position_ids=positions[: rows.numel()][None], logits_to_keep=1)
                logits = None if for_generation else out.logits[:, -1]
        return DroppedResult(cache=cache, logits=logits, exact_rows=kept, prompt_length=n, kept=kept,
                             positions=positions, prompt_rows=n, continues_at_prompt_end=self.continues_at_prompt_end)

    def prefill_cost(self, n: int, result: PrefillResult | None = None, plan: PromptPlan | None = None
                     ) -> PrefillCost:
        """The MACs of an n-token prompt's prefill: the scoring pass and the kept rows' (`macs`); the cache
        keeps k rows in every layer."""
        plan = plan if plan is not None else self.plan(n)
        config = self.model.config
        exact, full = prefill_macs(config, n), cache_rows(config, n)
        knob = {"budget": self.knob.budget, "knob_value": plan.knob_value} if self.knob is not None else {}
        k = n if plan.plain else plan.setting
        macs = exact if plan.plain else self.score_macs(n) + prefill_macs(config, k)
        return PrefillCost(n, macs, exact, k, cache_rows(config, k), full, None, **knob)

    def provenance(self) -> dict[str, Any]:
        info = super().provenance()
        if self.knob is not None:
            info["knob"] = self.knob_name
        return info
