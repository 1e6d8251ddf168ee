"""Small types the engine's callers plug in: selections, and hooks inside the late layers.

Selection: a selector's answer (rows, and optionally a longer tail: the
longer-tail control of paper section 2.4). LateLayerHooks / LayerView: the
places where corrections (section 2.3) and splices (section 6.6) change what a
late layer writes to its cache. With no hooks the engine's path is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # annotations only: the engine imports this module
    from rf_eval.engine import FillFn, LayerInputs, Plan
    from rf_eval.families import Family


@dataclass
class Selection:
    """What a selector may return instead of bare rows: prefix rows and, optionally, a new tail length.

    `tail` (None: unchanged) lets a control spend its rows on a longer exact tail
    (paper section 2.4, "the same number of rows added to the exact tail").
    """

    rows: torch.Tensor
    tail: int | None = None


@dataclass
class LayerView:
    """One late layer as `LateLayerHooks` see it (read-only by convention).

    x_in / h: the layer's input and normed input for every row it sees (`key_rows`,
    prompt order): predicted for filled rows, true for exact rows. `prefix_end` is
    N - tail. `predict(x_split_rows)` gives this layer's predicted input for rows'
    split states (layer S reads the split state itself).
    """

    index: int
    layer: nn.Module
    family: Family
    plan: Plan
    x_in: torch.Tensor
    h: torch.Tensor
    key_rows: torch.Tensor
    exact: torch.Tensor
    filled: torch.Tensor
    inputs: LayerInputs
    fill: FillFn | None

    @property
    def prefix_end(self) -> int:
        return self.inputs.x_split.shape[1] - self.plan.tail

    def predict(self, x_split_rows: torch.Tensor) -> torch.Tensor:
        if self.index == self.plan.split or self.fill is None:
            return x_split_rows
        return self.fill(self.index, x_split_rows)


@dataclass
class LateLayerHooks:
    """Optional callbacks inside `late_layers` (corrections, splices); None leaves the default path as is.

    kv(view, k, v) -> (k, v): an attention layer's keys (rotated) and values for
    `view.key_rows`, before they enter the cache. prefix_state(view, state) ->
    state: a Gated DeltaNet layer's recurrent state at the end of the prefix
    (N - tail rows scanned); given, the layer scans prefix and tail in two calls
    of the stock mixer (paper section 2.3, terminal-state correction).
    """

    kv: Callable[[LayerView, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    prefix_state: Callable[[LayerView, torch.Tensor], torch.Tensor] | None = None
