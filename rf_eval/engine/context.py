"""What a row selector reads (`PrefillContext`) and may answer (`Selection`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine.plan import LayerInputs, Plan
from rf_eval.engine.rowfill import RowFill
from rf_eval.families import Family


@dataclass
class PrefillContext:
    """Everything a row selector may read after the lower layers ran."""

    model: nn.Module
    family: Family
    input_ids: torch.Tensor
    plan: Plan
    inputs: LayerInputs
    cache: DynamicCache
    lower_inputs: dict[int, torch.Tensor]  # layer -> hidden state entering it (captured rows only)


@dataclass
class Selection:
    """What a selector may return instead of bare rows: prefix rows and, optionally, a new tail length.

    `tail` (None: unchanged) lets a control spend its rows on a longer exact tail
    (paper section 2.4, "the same number of rows added to the exact tail").
    `fill`: a strategy the selector built along the way (the probe's
    `Precomputed` K/V), laid over the engine's own by `RowFill.over`.
    """

    rows: torch.Tensor
    tail: int | None = None
    fill: RowFill | None = None


SelectFn = Callable[[PrefillContext], "torch.Tensor | Selection"]
