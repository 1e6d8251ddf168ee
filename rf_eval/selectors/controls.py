"""Count-matched controls (paper sections 2.4, 3.3): random rows and a longer tail.

`random`: as many prefix rows as a given selection (`of=`) picks on the same
prompt, or a fixed `count`, or round(`share` * N); drawn uniformly without
replacement from the prefix with a generator seeded by `seed`, so the same
seed, prompt length and count give the same rows.

`longer_tail`: the same count added to the exact tail instead of chosen
rows: a plan change (the engine's `Selection.tail`), not a selection.
"""

from __future__ import annotations

import torch

from rf_eval.engine import Selection
from rf_eval.selectors.base import Request, Selector, as_rows


class _Counted(Selector):
    counts_rows = True

    def __init__(self, of: Selector | None = None, count: int | None = None, share: float | None = None):
        given = [x is not None for x in (of, count, share)]
        if sum(given) != 1:
            raise ValueError(f"selector {self.name!r} needs exactly one of of=SELECTOR, count=, share=")
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if share is not None and not 0 <= share <= 1:
            raise ValueError(f"share must lie in [0, 1], got {share}")
        self.of, self.count_, self.share = of, count, share  # count_: `count` is the method

    def captures(self, req):
        return self.of.captures(req) if self.of is not None else {}

    def planned_rows(self, n: int, prefix: int) -> int | None:
        if self.of is not None:
            return self.of.planned_rows(n, prefix)
        return min(int(self.count_) if self.count_ is not None else int(round(self.share * n)), prefix)

    def matched_count(self, req: Request) -> int:
        if req.row_budget is not None:  # an arm's budget sets the count
            return req.row_budget
        if self.of is not None:
            return self.of.count(req)
        if self.count_ is not None:
            return int(self.count_)
        return int(round(self.share * req.n))


class RandomRows(_Counted):
    """Seeded uniform prefix rows, count-matched to another selection."""

    name = "random"

    def __init__(self, of: Selector | None = None, count: int | None = None, share: float | None = None,
                 seed: int = 0):
        super().__init__(of, count, share)
        self.seed = int(seed)

    def select(self, req):
        k = self.matched_count(req)
        cand = req.candidates()
        if k > cand.numel():
            raise ValueError(f"random: {k} rows asked for but the prefix has {cand.numel()} eligible rows")
        gen = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(cand.numel(), generator=gen)[:k]
        return Selection(as_rows(cand[order]))


class LongerTail(_Counted):
    """The matched count added to the exact tail."""

    name = "longer_tail"

    def select(self, req):
        k = self.matched_count(req)
        return Selection(torch.zeros(0, dtype=torch.long), tail=min(req.plan.tail + k, req.n))

    def count(self, req):
        return self.matched_count(req)
