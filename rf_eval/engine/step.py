"""One prompt's late-layer sweep as data: which rows run exactly, which keys they read, where K/V go.

A `LayerStep` is what `rf_eval.engine.layers.run_layer` and every row-fill
strategy (`rf_eval.engine.rowfill.RowFill`) read. The engine builds one per
prompt (every late layer, the model's own cache); the probe selector builds
one for its sweep (the probe rows exact, no cache).
"""

from __future__ import annotations

import dataclasses
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


#: (step, queries, keys, values, scale, attention module) -> attention context of the exact rows (1, |exact|, heads*D).
AttendFn = Callable[["LayerStep", torch.Tensor, torch.Tensor, torch.Tensor, float, nn.Module], torch.Tensor]


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
    _rope: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def to(self, device: torch.device) -> LayerStep:
        """This sweep with its rows and layer inputs on `device` (a layer placed there by a device map)."""
        if self.inputs.x_split.device == device:
            return self
        inputs = self.inputs.to(device)
        rows = Rows(*(t.to(device) for t in (self.rows.exact, self.rows.filled, self.rows.keys)))
        return dataclasses.replace(self, inputs=inputs, rows=rows)

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

    def stock_mask(self, attn: nn.Module, sliding: bool) -> torch.Tensor | None:
        """The stock model's causal (or sliding-window) mask for this prompt (None: SDPA's `is_causal`),
        built once per sweep."""
        masks = self.__dict__.setdefault("_stock_masks", {})
        if sliding not in masks:
            masks[sliding] = stock_mask(attn.config, self.inputs.x_split, sliding)
        return masks[sliding]

    def rope_at(self, index: int, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s RoPE tables at the `which` rows ("exact", "keys" or "filled").

        The split layer's tables (cached) unless the family rotates this layer
        with another kind (`Family.rope_kind`).
        """
        kind = self.family.rope_kind(self.layers[index])
        if kind is None or self.inputs.tables is None:
            if which == "filled":
                return self.inputs.cos[:, self.rows.filled], self.inputs.sin[:, self.rows.filled]
            return self.rope_exact if which == "exact" else self.rope_keys
        key = (kind, which)
        if key not in self._rope:
            cos, sin = self.inputs.rope(kind)
            rows = getattr(self.rows, which)
            self._rope[key] = cos[:, rows], sin[:, rows]
        return self._rope[key]

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attn: nn.Module) -> torch.Tensor:
        """The exact rows' attention context over `keys` (at `rows.keys`), as attention module `attn` attends.

        With every row exact, the stock layer's own attention call
        (`attend_like_stock`, with its mask, window and sinks): bitwise the stock
        layer. Otherwise a masked SDPA over the key rows (`attend_exact_rows`)
        with the layer's scale, sliding window and sinks (`Family.sliding_window`,
        `Family.attention_sinks`).
        """
        if self.attend is not None:
            return self.attend(self, q, keys, values, attn.scaling, attn)
        return self.engine_attention(q, keys, values, attn)

    def engine_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attn: nn.Module
                         ) -> torch.Tensor:
        """`attention` without the sweep's `attend`: the engine's own (an `attend` falls back to it)."""
        window, sinks = self.family.sliding_window(attn), self.family.attention_sinks(attn)
        if self.every_row_exact:
            extra = {k: v for k, v in (("sliding_window", window), ("s_aux", sinks)) if v is not None}
            return attend_like_stock(attn, q, keys, values, self.stock_mask(attn, window is not None), extra)
        chunks = QueryChunks(self.plan.query_chunk, self.prefix_end, window, sinks)
        return attend_exact_rows(q, keys, values, self.rows.exact, self.rows.keys, attn.scaling, chunks)
