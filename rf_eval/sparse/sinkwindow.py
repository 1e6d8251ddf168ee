"""The sparse family's fixed-pattern control: sink blocks and a local window (the A-shape of MInference,
Jiang et al. 2024, section 3; StreamingLLM's attention sinks and recent window, Xiao et al. 2024), the
same blocks for every prompt, layer and head.

Query block i computes key blocks j < `sink` (the first rows, which take most attention: the sinks) and
i - `window` <= j <= i (its recent rows). It reads nothing of the prompt, so what it keeps is known before
the prompt runs, and at one budget it is the control an adaptive method (FlexPrefill, XAttention) is
paired with: the sparse family's analogue of nofill, so "the method's choice of blocks matters" is a
paired claim. `budget=F` sets the window to the widest whose MACs stay within F of exact prefill's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rf_eval.cost.budget import Knob
from rf_eval.cost.mac_model import prefill_macs
from rf_eval.fields import ArmError
from rf_eval.methods.base import PromptPlan
from rf_eval.sparse.blocks import block_count, computed_pairs
from rf_eval.sparse.method import Choice, SparseArm, SparsePrefill

__all__ = ["SinkWindow"]


def sink_window(n: int, block: int, sink: int, window: int, heads: int = 1) -> torch.Tensor:
    """The pattern (heads, blocks, blocks): key blocks before `sink`, and the `window` blocks before the
    diagonal, within the causal triangle."""
    b = block_count(n, block)
    i, j = torch.arange(b)[:, None], torch.arange(b)[None, :]
    keep = ((j < sink) | (j >= i - window)) & (j <= i)
    return keep.expand(heads, b, b)


class SinkWindow(SparsePrefill):
    """Sink blocks and a local window in every full-attention layer; see the module docstring."""

    name = "sinkwindow"
    budget_sets = ("window",)
    budget_knob = "the local window's blocks"

    @dataclass(frozen=True, kw_only=True)
    class Arm(SparseArm):
        """`sink` key blocks (1) and `window` blocks before the diagonal (8: 1,024 rows at block 128), or
        `budget`."""

        sink: int = 1
        window: int | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.sink < 0 or (self.window is not None and self.window < 0):
                raise ArmError(f"sink and window count blocks (>= 0); got sink={self.sink}, window={self.window}")
            if self.window is not None and self.budget is not None:
                raise ArmError("give window or budget, not both: a budget sets the window")

    #: the window without a budget
    DEFAULT_WINDOW: ClassVar[int] = 8

    def budget_knob_for(self, config: Any) -> Knob:
        """The window, from none (the sink and diagonal blocks alone) to every block."""
        positions = getattr(config, "max_position_embeddings", None) or 1 << 20
        return Knob("window", float(self.arm.budget), lambda n, w: self.macs(n, self.pairs(n, w), 0),
                    lambda n: prefill_macs(config, n), lambda n: 0, lambda n: block_count(n, self.arm.block),
                    max_length=int(positions))

    def pairs(self, n: int, window: int) -> dict[int, float]:
        keep = sink_window(n, self.arm.block, self.arm.sink, window)
        return dict.fromkeys(self.layers, float(computed_pairs(keep, n, self.arm.block)[0]))

    def plan(self, n: int) -> PromptPlan:
        """The window for this length (the budget's, else the arm's); plain when it reaches every block."""
        window = self.knob.setting(n) if self.knob is not None else (
            self.arm.window if self.arm.window is not None else self.DEFAULT_WINDOW)
        blocks = block_count(n, self.arm.block)
        plain = blocks <= 1 or window >= blocks - 1 or self.arm.sink >= blocks - 1
        return PromptPlan(n, plain, n if plain else 0, window, window if self.knob is not None else None)

    def pattern(self, layer: int, query: torch.Tensor, key: torch.Tensor, plan: PromptPlan) -> Choice:
        return Choice(sink_window(query.shape[2], self.arm.block, self.arm.sink, plan.setting,
                                  query.shape[1]).to(query.device))

    def planned_pairs(self, n: int, plan: PromptPlan) -> dict[int, float] | None:
        return self.pairs(n, plan.setting)
