"""What one prompt's prefill cost under an arm: the per-item cost record every run writes beside its quality.

rf-eval's question has two halves (DESIGN 3c): what an approximation costs in
quality and what it saves. A method states its own cost through the prefill
protocol (`rf_eval.methods.base.Method.prefill_cost`): RidgeFill through the
MAC model of its paper's section 2.5 (`rf_eval.cost.mac_model`, each fill's
`filled_row_macs`), RaReCache through eq. 11's accounting with the source
model's prefill charged (`rf_eval.rarecache.cost`). The record is plain data,
so a report reads every method the same way, with no per-method code.

Each rf-eval task writes a record's `fields()` into every sample (lm-eval
metrics, so `lm_eval`'s own table shows their means): the arm's and exact's
multiply-accumulates for the whole prompt, their ratio and its inverse (the MAC
speedup ceiling), 1/r of section 2.5 where it applies, the late-layer exact rows
(tail + selected), the cache entries the prompt leaves (rows x attention
layers: a method that drops rows keeps fewer), the measured prefill seconds
(`rf_eval.prefill_timer`: the device synchronised on CUDA; a wall-clock time on
a shared CPU, as the run's provenance says), for an arm set by a budget, the budget
and the value its knob took (`rf_eval.cost.budget`), and for a sparse-attention
prefill the share of the causal attention it computed (`attention_density`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["COST_FIELDS", "MEASURED_FIELDS", "PrefillCost", "empty_fields", "request_key"]

#: The fields a rerun measures anew (timings): every other field of a sample is the same from one run to the next.
MEASURED_FIELDS = ("prefill_seconds", "exact_prefill_seconds")
#: The per-sample fields of a cost record, in the order tasks declare them (all numbers, or None).
COST_FIELDS = ("prompt_tokens", "prefill_macs", "exact_macs", "macs_fraction", "mac_speedup",
               "layer_pass_speedup", "exact_rows", "cache_entries", "cache_fraction", "prefill_seconds",
               "exact_prefill_seconds", "budget", "knob_value", "attention_density")


@dataclass(frozen=True)
class PrefillCost:
    """One prompt's prefill under an arm, against the exact model's prefill of the same prompt."""

    prompt_tokens: int
    prefill_macs: int
    exact_macs: int
    #: late-layer exact rows: the tail and the selected rows (every row for a plain prompt)
    exact_rows: int
    #: rows held in the attention layers' caches after the prefill, summed over those layers
    cache_entries: int
    exact_cache_entries: int
    #: 1/r, the layer-pass ceiling of RidgeFill section 2.5, where the method has one (None elsewhere)
    layer_pass_speedup: float | None = None
    #: the budget the arm was set by (None: no budget) and the value its knob took for this prompt
    budget: float | None = None
    knob_value: float | None = None
    #: measured seconds of the prefill (`rf_eval.prefill_timer`); None where it was not a step of its own
    prefill_seconds: float | None = None
    #: measured seconds of the exact prefill of the same prompt in the same process, beside the arm's (the
    #: `reference=exact` pass, interleaved): the reference a measured speedup is paired in time with
    exact_prefill_seconds: float | None = None
    #: a sparse-attention prefill's share of the causal triangle's (query, key) pairs computed, over the layers
    #: it makes sparse (`rf_eval.sparse`); None for a method that computes every pair it keeps
    attention_density: float | None = None

    @property
    def macs_fraction(self) -> float:
        return self.prefill_macs / self.exact_macs

    @property
    def mac_speedup(self) -> float:
        return self.exact_macs / self.prefill_macs

    def timed(self, seconds: float | None) -> PrefillCost:
        return PrefillCost(**{**self.__dict__, "prefill_seconds": seconds})

    def fields(self) -> dict[str, float | int | None]:
        """The record as one sample's fields (`COST_FIELDS`)."""
        return {
            "prompt_tokens": self.prompt_tokens, "prefill_macs": self.prefill_macs, "exact_macs": self.exact_macs,
            "macs_fraction": self.macs_fraction, "mac_speedup": self.mac_speedup,
            "layer_pass_speedup": self.layer_pass_speedup, "exact_rows": self.exact_rows,
            "cache_entries": self.cache_entries, "cache_fraction": self.cache_entries / self.exact_cache_entries,
            "prefill_seconds": self.prefill_seconds, "exact_prefill_seconds": self.exact_prefill_seconds,
            "budget": self.budget, "knob_value": self.knob_value, "attention_density": self.attention_density,
        }  # fmt: skip


def empty_fields() -> dict[str, None]:
    """A sample's cost fields where its run recorded none (another lm-eval model, a request type without one)."""
    return dict.fromkeys(COST_FIELDS)


def request_key(prompt: Any) -> str:
    """The key a prompt's cost is recorded under: sha256 of a request's first argument as lm-eval passes it
    (the context string; a list of turns as JSON), so a task finds the record of the request it built."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
