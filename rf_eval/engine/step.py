"""One prompt's late-layer sweep as data: which rows run exactly, which keys they read, where K/V go.

A `LayerStep` is what `rf_eval.engine.layers.run_layer` and every row-fill
strategy (`rf_eval.engine.rowfill.RowFill`) read. The engine builds one per
prompt (every late layer, the model's own cache); the probe selector builds
one for its sweep (the probe rows exact, no cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine.attention import QueryChunks, attend_exact_rows, attend_like_stock, stock_mask
from rf_eval.engine.plan import LayerInputs, Plan
from rf_eval.families import Family


@dataclass(frozen=True)
class Rows:
    """Sorted prompt rows of one sweep.

    exact: rows the late layers run (queries, attention output, MLP). filled:
    rows whose keys/values (or recurrent inputs) the strategy supplies. keys:
    rows the layers' keys cover, in prompt order (exact and filled rows, or only
    the exact rows when filled rows are absent: nofill). whole_prompt: the rows
    are the prompt's own positions 0..n-1 (built by `of`), so with every row
    exact the layers see what the stock layers see.
    """

    exact: torch.Tensor
    filled: torch.Tensor
    keys: torch.Tensor
    whole_prompt: bool = False

    @classmethod
    def of(cls, n: int, exact: torch.Tensor, absent: bool) -> Rows:
        """Every row of an n-row prompt not in `exact` is filled; `absent`: filled rows hold no keys."""
        is_filled = torch.ones(n, dtype=torch.bool, device=exact.device)
        is_filled[exact] = False
        keys = exact if absent else torch.arange(n, device=exact.device)
        return cls(exact, is_filled.nonzero().squeeze(1), keys, whole_prompt=True)

    @cached_property
    def exact_at(self) -> torch.Tensor:
        """Where the exact rows sit in `keys`."""
        return torch.searchsorted(self.keys, self.exact)

    @cached_property
    def filled_at(self) -> torch.Tensor:
        """Where the filled rows sit in `keys` (meaningful when they hold keys)."""
        return torch.searchsorted(self.keys, self.filled)


#: (step, queries, keys, values, scale) -> attention context of the exact rows (1, |exact|, heads*D).
AttendFn = Callable[["LayerStep", torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass
class LayerStep:
    """What one sweep over late layers shares across layers (see the module docstring).

    `cache`: the model's cache that each layer's K/V (and recurrent state)
    enter; None runs the layers without one (the probe). `attend`: attention
    of the exact rows (None: `attend_exact_rows`, the engine's own).
    """

    family: Family
    layers: nn.ModuleList
    plan: Plan
    inputs: LayerInputs
    rows: Rows
    cache: DynamicCache | None
    attend: AttendFn | None = None

    @property
    def n(self) -> int:
        return self.inputs.x_split.shape[1]

    @property
    def prefix_end(self) -> int:
        """N - tail: the first tail row."""
        return self.n - self.plan.tail

    @cached_property
    def x_filled(self) -> torch.Tensor:
        """Split states of the filled rows (1, |filled|, d)."""
        return self.inputs.x_split[:, self.rows.filled]

    @cached_property
    def rope_exact(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables (cos, sin) at the exact rows."""
        return self.inputs.cos[:, self.rows.exact], self.inputs.sin[:, self.rows.exact]

    @cached_property
    def rope_keys(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables (cos, sin) at the key rows."""
        return self.inputs.cos[:, self.rows.keys], self.inputs.sin[:, self.rows.keys]

    @property
    def every_row_exact(self) -> bool:
        """True when the layers run every row of the whole prompt and their keys are every row (none filled)."""
        rows = self.rows
        return rows.whole_prompt and rows.exact.numel() == self.n and rows.keys.numel() == self.n

    def stock_mask(self, attn: nn.Module) -> torch.Tensor | None:
        """The stock model's causal mask for this prompt (None: SDPA's `is_causal`), built once per sweep."""
        if "_stock_mask" not in self.__dict__:
            self.__dict__["_stock_mask"] = stock_mask(attn.config, self.inputs.x_split)
        return self.__dict__["_stock_mask"]

    def attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, attn: nn.Module | None = None
    ) -> torch.Tensor:
        """The exact rows' attention context over `keys` (at `rows.keys`).

        With every row exact and the layer's module `attn` given, the stock
        layer's own attention call (`attend_like_stock`): bitwise the stock
        layer. Otherwise a masked SDPA over the key rows (`attend_exact_rows`).
        """
        if self.attend is not None:
            return self.attend(self, q, keys, values, scale)
        if attn is not None and self.every_row_exact:
            return attend_like_stock(attn, q, keys, values, self.stock_mask(attn))
        chunks = QueryChunks(self.plan.query_chunk, self.prefix_end)
        return attend_exact_rows(q, keys, values, self.rows.exact, self.rows.keys, scale, chunks)
