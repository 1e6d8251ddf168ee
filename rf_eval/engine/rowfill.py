"""The row-fill strategy interface: what a late layer's filled rows contribute.

RidgeFill paper section 2.1: in a late layer l >= S a prompt row is exact
(the layer runs it) or filled: the layer needs only what later rows read from
it, its keys and values in an attention layer and its update of the conv and
recurrent state in a Gated DeltaNet layer. Where that comes from is the
strategy (`rf_eval.engine.strategies`):

- `PredictedInput`: from a predicted input x̂_l = fill(l, x_S) through the
  layer's own norm and projections (identity, ridge);
- `AbsentRows`: nowhere; filled rows are absent from late layers (nofill);
- `MappedKV`: rotated keys and values mapped from another model's cache
  (RaReCache, its section 3);
- `Precomputed`: K/V a selector already computed from the same fill (the probe);
- `Corrected`: a strategy whose K/V or prefix state a correction or splice
  adjusts (section 2.3, 6.6).

`rf_eval.engine.layers.run_layer` asks the strategy for the layer's keys and
values (attention) or its mixer output (recurrent) and runs the rest of the
layer for the exact rows only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

import torch

from rf_eval.engine.step import LayerStep


class AttentionRows(NamedTuple):
    """What a strategy gives one attention layer: the exact rows' normed input and K/V at `rows.keys`."""

    h_exact: torch.Tensor  # (1, |exact|, d): the exact rows' normed input (their queries come from it)
    keys: torch.Tensor  # (1, kv_heads, |keys|, D), rotated
    values: torch.Tensor


class RowFill(ABC):
    """A row-fill strategy (see the module docstring)."""

    #: True when filled rows hold no keys in late layers (the cache is ragged: nofill).
    absent: ClassVar[bool] = False
    #: The lowest split this strategy can start from (a fill from split states needs layer 0 to run).
    min_split: ClassVar[int] = 1

    @abstractmethod
    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        """Attention layer `index`: K/V for `step.rows.keys` (exact rows included) and the exact rows' normed input."""

    @abstractmethod
    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        """Gated DeltaNet layer `index`: the mixer's output for the exact rows (its state enters `step.cache`)."""

    def over(self, base: RowFill) -> RowFill:
        """The strategy to run when a selector hands this one in and the engine's own is `base`."""
        return self
