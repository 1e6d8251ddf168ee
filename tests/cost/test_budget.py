"""A budget's refusal names a fix the budget option accepts (issue #54, item 5): an arm whose cheapest setting
costs more than exact prefill (RaReCache's source prefill and transfer beside a few recomputed rows) is told that
no budget can meet it, never to give a budget above 1, which `budget=` refuses."""

from __future__ import annotations

import pytest

from rf_eval.cost.budget import BudgetError, Knob


def knob(budget: float, overhead: int) -> Knob:
    """An arm whose MACs at n tokens and value v are `overhead` * n + v (exact: 100 * n)."""
    return Knob("rows", budget, lambda n, v: overhead * n + v, lambda n: 100 * n, lambda n: 1, lambda n: n,
                max_length=1024)


@pytest.mark.parametrize("overhead, says", [
    (50, "give budget >= 0.501"),
    (101, "no budget can meet it (a budget is at most 1): run the arm without budget="),
])
def test_an_unreachable_budget_names_a_fix_budget_accepts(overhead, says):
    with pytest.raises(BudgetError, match=r"budget=0\.2 is below the cheapest this arm reaches") as err:
        knob(0.2, overhead).check_reachable()
    assert says in str(err.value) and ">= 1.0" not in str(err.value)
