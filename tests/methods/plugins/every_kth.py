"""`every_kth`: a throwaway dropper (tests only): the cache holds every k-th prompt row, ending at the last.

One file, found through RF_EVAL_METHOD_PATH: its own arm field (`k`), a budget (`Dropper`'s knob: the kept
rows a share of exact's MACs pays for, in place of `k`) and its cost (no scoring pass: the kept rows' prefill).
"""

import math
from dataclasses import dataclass

import torch

from rf_eval.drop.base import Dropper, DropperArm


class EveryKth(Dropper):
    name = "every_kth"
    budget_sets = ("k",)
    budget_knob = "the kept rows"

    @dataclass(frozen=True, kw_only=True)
    class Arm(DropperArm):
        k: int = 2

    def keep_count(self, n):
        return math.ceil(n / self.arm.k)

    def keep_rows(self, ids, count):
        n = ids.shape[1]
        return torch.unique(torch.linspace(n - 1, 0, count).round().long()).sort().values  # the last row first

    def score_macs(self, n):
        return 0
