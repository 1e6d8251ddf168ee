"""What every token-dropping method shares: the prefill protocol around one rule, "which rows to keep".

A method subclasses `DropMethod` in a module of its own and says
- `keep_rows(ids)`: the kept rows of a 1 x N prompt (sorted), from its scores;
- `prefill_kept(ids, kept, for_generation)`: the model's prefill of those rows alone, at its positions;
- `cost_parts(n, k)` and `knob`: its multiply-accumulates for k kept rows of N (the scoring pass, the
  rerun), which `budget=` turns (`rf_eval.budget`).

Keeping every row is the exact model: a prompt no longer than the rows kept
is the plain model's prefill, bitwise (`is_plain`). A dropper reads the whole
prompt, its last token included, for a generation prefill as well
(`reads_whole_prompt`: the shells hand it the whole prompt and `generate`
then runs the last kept row, `rf_eval.dropped_result.generation_inputs`).
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn

from rf_eval.budget import Knob
from rf_eval.devices import input_device
from rf_eval.drop.arm_spec import DropArm
from rf_eval.dropped_result import DroppedResult, extend_after
from rf_eval.engine import PrefillResult, new_cache, plain_prefill
from rf_eval.fields import ArmError
from rf_eval.mac_model import cache_rows, prefill_macs
from rf_eval.method import check_prompt, generate, method_forward, model_identity, prefill_each
from rf_eval.prefill_cost import PrefillCost
from rf_eval.weights import weights_fingerprint

__all__ = ["DropMethod"]


class DropMethod:
    """A token-dropping prefill method over one model; see the module docstring."""

    name: ClassVar[str] = ""
    #: renumbered: the kept rows run at positions 0..k-1 (else at their original positions)
    renumbered: ClassVar[bool] = False
    #: the shells hand a generation prefill the whole prompt (the rule reads its last token)
    reads_whole_prompt: ClassVar[bool] = True
    #: what `budget=` turns, by name (`rf_eval.budget.Knob`)
    knob_name: ClassVar[str] = "rows"

    def __init__(self, model: nn.Module, tokenizer: Any = None, *, arm: Any = None, **fields: Any):
        if arm is None:
            arm = DropArm.from_fields({"method": self.name, **fields}, what=type(self).__name__)
        elif fields:
            raise TypeError(f"give arm= or the arm's fields, not both (got {', '.join(fields)})")
        if arm.method != self.name:
            raise ArmError(f"arm method={arm.method} given to {type(self).__name__} ({self.name})")
        self.model, self.tokenizer, self.spec = model.eval(), tokenizer, arm
        positions = getattr(model.config, "max_position_embeddings", None) or 1 << 20
        self.knob = None if arm.budget is None else Knob(
            self.knob_name, float(arm.budget), self.macs, functools.partial(prefill_macs, model.config),
            lambda n: 1, self.knob_top, max_length=int(positions))
        if self.knob is not None:
            self.knob.check_reachable()

    # -- what a method provides ---------------------------------------------------------
    def keep_count(self, n: int) -> int:
        """Rows an n-token prompt keeps, by the arm's settings (before the budget)."""
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
    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    def kept_count(self, n: int) -> int:
        """Rows an n-token prompt keeps: the budget's, else the arm's settings."""
        return self.rows_of(n, self.knob.setting(n)) if self.knob is not None else min(self.keep_count(n), n)

    def is_plain(self, n: int) -> bool:
        """Every row kept: the plain model's prefill, bitwise."""
        return self.kept_count(n) >= n

    def forward_context(self) -> AbstractContextManager:
        """The context a request runs the model in (`rf_eval.method.method_forward`), entered once per request."""
        return method_forward(self)

    def exact_tail(self, n: int) -> int:
        return n if self.is_plain(n) else 0

    def macs(self, n: int, value: int) -> int:
        """An n-token prompt's prefill MACs at knob value `value`: the scoring pass and the prefill of the kept
        rows (causal among themselves), or exact's when every row is kept."""
        k = self.rows_of(n, value)
        if k >= n:
            return prefill_macs(self.model.config, n)
        return self.score_macs(n) + prefill_macs(self.model.config, k)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, *, for_generation: bool = False, held_back: int = 0) -> PrefillResult:
        """The prefill of a 1 x N prompt: the plain model's when every row is kept, else the kept rows' alone.
        `for_generation`: `input_ids` is the whole prompt (`reads_whole_prompt`); the cache then holds the
        kept rows but the last, which `generate` runs."""
        if held_back:
            raise ValueError(f"held_back={held_back}: {self.name} chooses its rows from the whole prompt")
        ids = check_prompt(input_ids, self.model).to(self.device)
        n = ids.shape[1]
        k = self.kept_count(n)
        if k >= n:  # every row kept (`is_plain`, which the request's shell asked once already)
            return plain_prefill(self.model, ids[:, :-1] if for_generation else ids)
        kept = self.keep_rows(ids, k).to(ids.device)
        positions = torch.arange(kept.numel(), device=ids.device) if self.renumbered else kept
        rows = kept[:-1] if for_generation else kept
        cache = new_cache(self.model)
        logits = None
        if rows.numel():
            out = self.model(input_ids=ids[:, rows], cache=cache, use_cache=True,
                             position_ids=positions[: rows.numel()][None], logits_to_keep=1)
            logits = None if for_generation else out.logits[:, -1]
        return DroppedResult(cache=cache, logits=logits, exact_rows=kept, prompt_length=n, kept=kept,
                             positions=positions, prompt_rows=n)

    def prefill_batch(self, input_ids: torch.Tensor, *, for_generation: bool = False) -> list[PrefillResult]:
        return prefill_each(self, input_ids, for_generation=for_generation)

    def extend(self, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
        """The stock model over `tokens` after the kept rows."""
        return extend_after(self.model, result, tokens.to(self.device))

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return generate(self, input_ids, **kwargs)

    def speedup_ceilings(self, n: int) -> dict[str, float]:
        return {"mac_ceiling": self.prefill_cost(n).mac_speedup}

    def prefill_cost(self, n: int, result: PrefillResult | None = None) -> PrefillCost:
        """The MACs of an n-token prompt's prefill: the scoring pass and the kept rows' (`macs`); the cache
        keeps k rows in every layer."""
        config = self.model.config
        exact, full = prefill_macs(config, n), cache_rows(config, n)
        knob = {"budget": self.knob.budget, "knob_value": self.knob.setting(n)} if self.knob is not None else {}
        k = min(self.kept_count(n), n)  # n for a plain prompt (`is_plain`: every row kept)
        macs = exact if k >= n else self.score_macs(n) + prefill_macs(config, k)
        return PrefillCost(n, macs, exact, k, cache_rows(config, k), full, None, **knob)

    @functools.cached_property
    def weights_sha256(self) -> str:
        """The model's weights fingerprint (`rf_eval.weights`), read when first recorded."""
        return weights_fingerprint(self.model)

    def provenance(self) -> dict[str, Any]:
        return {**self.spec.describe(), **model_identity(self.model, self.weights_sha256)}
