"""Arms set by a compute budget: `budget=F`, at most F of exact prefill's multiply-accumulates at each length.

Methods compare at equal cost only when each spends the same compute (DESIGN
3c; RidgeFill paper section 8: "We do not compare with any token-dropping method
at a matched budget"). Each method declares one *knob*, an integer setting whose
cost grows with it, and how a prompt of N tokens costs at each value:

- the tail (RidgeFill's fills without a row selector; the compute-matched
  `nofill` control of section 3.3 generalised to any fill),
- the selected rows (a row selector that counts its rows: the share it selects),
- the split (a preset's arm, POP's identity fill at a one-token tail),
- the recomputed rows (RaReCache's rho, ceil(rho T) positions), or the
  recomputed layers (its layer-prefix baseline).

For each prompt length the knob takes the largest value whose cost does not
exceed F times exact's (`Knob.setting`): the arm spends its budget and is
within one knob step of it. A budget no value meets at any length is refused
before the model loads, naming the cheapest fraction the arm reaches
(`Knob.check_reachable`); a prompt too short to meet it is a `BudgetError`
naming its length and the shortest length that meets it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from rf_eval.fields import ArmError

__all__ = ["BudgetError", "Knob", "budget_name", "check_budget", "largest_within"]

#: prompt lengths the cheapest fraction is looked for at: 2^4 .. 2^20 tokens (capped at the model's positions)
_PROBE_LENGTHS = tuple(2**k for k in range(4, 21))


class BudgetError(ArmError):
    """A budget the arm cannot meet: the message names the budget, the length and the cheapest fraction."""


def largest_within(lo: int, hi: int, cost: Callable[[int], float], target: float) -> int:
    """The largest value in lo..hi whose `cost` (non-decreasing) does not exceed `target` (lo when none does)."""
    while lo < hi:  # binary search for the last value within the target
        mid = (lo + hi + 1) // 2
        if cost(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_budget(value: float | None) -> None:
    """`budget` lies in (0, 1] (a share of exact prefill's MACs)."""
    if value is not None and not 0 < value <= 1:
        raise ArmError(f"budget={value!r} is not a share of exact prefill's MACs; give 0 < budget <= 1")


def budget_name(name: str, budget: float) -> str:
    """The name of arm `name` set by `budget`: `ridge@0.5` (a study's `budgets:` names its arms so, and a
    report names an arm run with `budget=` so)."""
    return f"{name}@{float(budget):g}"


@dataclass(frozen=True, eq=False)
class Knob:
    """One arm's knob: its name, its range at each prompt length, and the arm's MACs at each value.

    `lowest(n)` and `highest(n)` bound the value at an n-token prompt; `macs(n, value)` is the arm's prefill
    MACs there, non-decreasing in `value`; `exact_macs(n)` is the exact model's.
    """

    name: str
    budget: float
    macs: Callable[[int, int], int]
    exact_macs: Callable[[int], int]
    lowest: Callable[[int], int]
    highest: Callable[[int], int]
    #: the model's positions: the longest prompt a budget has to be met at
    max_length: int = 1 << 20

    def fraction(self, n: int, value: int) -> float:
        return self.macs(n, value) / self.exact_macs(n)

    @functools.lru_cache(maxsize=4096)  # noqa: B019  (one knob per arm; a run asks for few lengths, often)
    def setting(self, n: int) -> int:
        """The largest value whose MACs at n tokens do not exceed the budget (a `BudgetError` when none does)."""
        lo, hi = self.lowest(n), self.highest(n)
        target = self.budget * self.exact_macs(n)
        if self.macs(n, lo) > target:
            shortest = self.shortest_length()
            where = f"; it is met from {shortest:,} tokens on" if shortest is not None else ""
            raise BudgetError(
                f"budget={self.budget:g}: a {n:,}-token prompt costs at least {self.fraction(n, lo):.3f} of exact "
                f"prefill's MACs under this arm ({self.name} {lo}){where}; raise the budget or give longer prompts")
        return largest_within(lo, hi, lambda value: self.macs(n, value), target)

    def lengths(self) -> list[int]:
        return sorted({n for n in _PROBE_LENGTHS if n <= self.max_length} | {self.max_length})

    def cheapest(self) -> tuple[float, int]:
        """(the lowest fraction the arm reaches at any probed length, that length)."""
        return min((self.fraction(n, self.lowest(n)), n) for n in self.lengths())

    def shortest_length(self) -> int | None:
        """The shortest probed length at which the budget is met (None: at none)."""
        return next((n for n in self.lengths() if self.fraction(n, self.lowest(n)) <= self.budget), None)

    def check_reachable(self, lengths: list[int] | None = None) -> None:
        """Refuse (`BudgetError`) a budget no value meets: at every length the model takes, or, given
        `lengths` (a study's), at any of them."""
        if lengths:
            for n in lengths:
                self.setting(int(n))
            return
        cheapest, at = self.cheapest()
        if cheapest > self.budget:
            # a budget is at most 1: an arm that costs more than exact prefill at its cheapest takes none
            fix = (f"give budget >= {_ceil3(cheapest)}" if cheapest <= 1 else
                   "no budget can meet it (a budget is at most 1): run the arm without budget=, at its own setting")
            raise BudgetError(
                f"budget={self.budget:g} is below the cheapest this arm reaches on this model: {cheapest:.3f} of "
                f"exact prefill's MACs ({self.name} {self.lowest(at)}, at {at:,} tokens); {fix}")


def _ceil3(x: float) -> str:
    """x rounded up to 3 decimals, as text."""
    import math

    return f"{math.ceil(x * 1000) / 1000:.3f}"
