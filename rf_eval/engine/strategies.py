"""The row-fill strategies from a filled row's predicted input (interface: `rf_eval.engine.rowfill`), the
absent rows of `nofill`, precomputed keys and values, and the wrapper corrections plug into; the strategies that
supply filled rows' keys and values directly are `rf_eval.engine.kv_strategies`.

Strategies are the engine's: how a late layer gets what filled rows contribute. The fills that choose one per
arm (`fill=`) live in `rf_eval.fills`; no class here shares a name with one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rf_eval.engine.plan import FILL_OFF, MAPPED, FillFn, LayerInputs, Plan
from rf_eval.engine.rowfill import AttentionRows, RowFill
from rf_eval.engine.step import LayerStep
from rf_eval.families import Family


class LayerView:
    """One late layer under a predicted-input fill, as `LateLayerHooks` see it (read-only by convention).

    x_in / h: the layer's input and normed input for every row it sees (`key_rows`,
    prompt order): predicted for filled rows, true for exact rows. `prefix_end` is
    N - tail. `predict(x_split_rows)` gives this layer's predicted input for rows'
    split states (at layer S: the fill's own map with `plan.map_split`, else the split state itself).
    """

    def __init__(self, step: LayerStep, fill: PredictedInput, index: int, x_in: torch.Tensor, h: torch.Tensor):
        self.step, self.fill, self.index, self.x_in, self.h = step, fill, index, x_in, h

    @property
    def layer(self) -> nn.Module:
        return self.step.layers[self.index]

    @property
    def family(self) -> Family:
        return self.step.family

    @property
    def plan(self) -> Plan:
        return self.step.plan

    @property
    def inputs(self) -> LayerInputs:
        return self.step.inputs

    @property
    def key_rows(self) -> torch.Tensor:
        return self.step.rows.keys

    @property
    def exact(self) -> torch.Tensor:
        return self.step.rows.exact

    @property
    def filled(self) -> torch.Tensor:
        return self.step.rows.filled

    @property
    def prefix_end(self) -> int:
        return self.step.prefix_end

    @property
    def h_exact(self) -> torch.Tensor:
        """The exact rows' normed input."""
        return self.h if self.fill.absent else self.h[:, self.step.rows.exact]

    def predict(self, x_split_rows: torch.Tensor) -> torch.Tensor:
        return self.fill.predict(self.step, self.index, x_split_rows)


@dataclass(frozen=True)
class PredictedInput(RowFill):
    """Filled rows' input to late layer l is x̂_l = fill(l, x_S) (paper section 2.1: identity, ridge).

    Layer S reads fill(S, x_S) with `plan.map_split` (the paper's released maps
    cover layers S..L-1), else x_S itself (exact already). Each layer runs its own
    input norm and K/V projections (k-norm, RoPE) over every row it sees at
    once, so with every row exact it is the stock layer; a Gated DeltaNet
    layer's stock mixer scans predicted inputs of filled rows and true inputs
    of exact rows in order, and only the exact rows' outputs are kept.
    `fill` None: the split state itself at every layer (only used with no
    filled rows).
    """

    fill: FillFn | None = None

    def predict(self, step: LayerStep, index: int, x_rows: torch.Tensor) -> torch.Tensor:
        """Layer `index`'s predicted input for rows whose split states are `x_rows`."""
        if self.fill is None or (index == step.plan.split and not step.plan.map_split):
            return x_rows
        return self.fill(index, x_rows)

    def view(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> LayerView:
        """Layer `index`'s input for every key row (prompt order) and its normed input."""
        if self.absent:
            x_in = x_exact
        else:
            x_in = torch.empty_like(step.inputs.x_split)
            x_in[:, step.rows.filled] = self.predict(step, index, step.x_filled)
            x_in[:, step.rows.exact] = x_exact
        return LayerView(step, self, index, x_in, step.family.input_norm(step.layers[index], x_in))

    @staticmethod
    def project(view: LayerView) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values the layer writes for every row of the view."""
        cos, sin = view.step.rope_at(view.index, "keys")
        return view.family.kv(view.layer.self_attn, view.h, cos, sin)

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        view = self.view(step, index, x_exact)
        return AttentionRows(view.h_exact, *self.project(view))

    def scan(self, view: LayerView) -> torch.Tensor:
        """The stock Gated DeltaNet mixer over the view's rows; the exact rows' outputs."""
        mixed = view.layer.linear_attn(hidden_states=view.h, cache=view.step.cache, attention_mask=None)
        return mixed if self.absent else mixed[:, view.step.rows.exact]

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        return self.scan(self.view(step, index, x_exact))

    def filled_kv(self, step: LayerStep, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention layer `index`'s keys (rotated) and values of the filled rows alone, from their predicted input."""
        layer = step.layers[index]
        h = step.family.input_norm(layer, self.predict(step, index, step.x_filled))
        return step.family.kv(layer.self_attn, h, *step.rope_at(index, "filled"))


class AbsentRows(PredictedInput):
    """Filled rows are absent from late layers (the `nofill` arm): each layer sees its exact rows only."""

    absent = True

    def __init__(self):
        super().__init__(None)


def exact_rows_beside(
    step: LayerStep, index: int, x_exact: torch.Tensor, filled_kv: tuple[torch.Tensor, torch.Tensor], into: bool = False
) -> AttentionRows:
    """K/V of attention layer `index` at `rows.keys`: `filled_kv` for the filled rows, the exact rows' own beside.

    The exact rows' K/V come from their own normed input. `filled_kv` holds the
    filled rows' (rotated) keys and values; with `into` it is the layer's
    full-length pair already holding them, and the exact rows are written into it.
    """
    layer, rows = step.layers[index], step.rows
    h_exact = step.family.input_norm(layer, x_exact)
    k_exact, v_exact = step.family.kv(layer.self_attn, h_exact, *step.rope_at(index, "exact"))
    if into:
        k, v = filled_kv
    else:
        k_filled, v_filled = filled_kv
        k = k_exact.new_empty((*k_exact.shape[:2], rows.keys.numel(), k_exact.shape[-1]))
        v = v_exact.new_empty((*v_exact.shape[:2], rows.keys.numel(), v_exact.shape[-1]))
        k[:, :, rows.filled_at], v[:, :, rows.filled_at] = k_filled.to(k), v_filled.to(v)
    k[:, :, rows.exact_at], v[:, :, rows.exact_at] = k_exact.to(k), v_exact.to(v)
    return AttentionRows(h_exact, k, v)


class Precomputed(RowFill):
    """K/V that `source` gives filled rows 0..rows-1, computed before the late layers ran (the probe's sweep).

    `kv[l]` is a pair of (1, kv_heads, N, head_dim) tensors whose first `rows`
    rows hold what attention layer l writes for a filled row; the exact rows are
    written into the same tensors (taken out of `kv`), so sharing costs no
    memory beyond the cache. A layer it does not hold, or a prompt with a
    filled row at or after `rows`, runs `source` instead.
    """

    def __init__(self, source: PredictedInput, rows: int):
        self.source, self.rows = source, int(rows)
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(self, index: int, kv: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
        """Keep layer `index`'s K/V of rows 0..rows-1 in full-length (n-row) tensors."""
        k_f, v_f = kv
        k_all = k_f.new_empty((*k_f.shape[:2], n, k_f.shape[-1]))
        v_all = v_f.new_empty((*v_f.shape[:2], n, v_f.shape[-1]))
        k_all[:, :, : self.rows], v_all[:, :, : self.rows] = k_f, v_f
        self.kv[index] = (k_all, v_all)

    def over(self, base: RowFill) -> RowFill:
        """Reuse these K/V only where the engine runs the very fill they came from (no correction wraps it)."""
        return self if base == self.source else base

    def covers(self, step: LayerStep) -> bool:
        filled = step.rows.filled
        return filled.numel() == 0 or int(filled[-1]) < self.rows

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        if index in self.kv and self.covers(step):
            return exact_rows_beside(step, index, x_exact, self.kv.pop(index), into=True)
        return self.source.attention(step, index, x_exact)

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        return self.source.recurrent(step, index, x_exact)


@dataclass
class LateLayerHooks:
    """Callbacks that adjust a predicted-input fill (corrections, splices); None leaves that part as is.

    kv(view, k, v) -> (k, v): an attention layer's keys (rotated) and values for
    `view.key_rows`, before they enter the cache. prefix_state(view, state) ->
    state: a Gated DeltaNet layer's recurrent state at the end of the prefix
    (N - tail rows scanned); given, the layer scans prefix and tail in two calls
    of the stock mixer (paper section 2.3, terminal-state correction).
    """

    kv: Callable[[LayerView, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    prefix_state: Callable[[LayerView, torch.Tensor], torch.Tensor] | None = None


def scan_with_prefix_state(
    view: LayerView, prefix_state: Callable[[LayerView, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The stock Gated DeltaNet mixer over the prefix, then `prefix_state` on its state, then the tail.

    The conv and recurrent state carry across the two calls (the cache's own
    continuation path), so with an identity `prefix_state` this equals one scan
    up to rounding.
    """
    end, cache, mixer = view.prefix_end, view.step.cache, view.layer.linear_attn
    first = mixer(hidden_states=view.h[:, :end], cache=cache, attention_mask=None)
    state = cache.get_recurrent_state(view.index)
    cache.update_recurrent_state(prefix_state(view, state).to(state.dtype), view.index)
    second = mixer(hidden_states=view.h[:, end:], cache=cache, attention_mask=None)
    return torch.cat([first, second], 1)


class Corrected(RowFill):
    """A predicted-input strategy whose K/V and prefix state `hooks` adjust (paper sections 2.3, 6.6)."""

    def __init__(self, inner: PredictedInput, hooks: LateLayerHooks):
        if not isinstance(inner, PredictedInput):
            raise ValueError("late-layer hooks apply to a fill from predicted inputs, not to mapped or given K/V")
        self.inner, self.hooks = inner, hooks
        self.absent = inner.absent

    def attention(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> AttentionRows:
        view = self.inner.view(step, index, x_exact)
        k, v = self.inner.project(view)
        if self.hooks.kv is not None:
            k, v = self.hooks.kv(view, k, v)
        return AttentionRows(view.h_exact, k, v)

    def recurrent(self, step: LayerStep, index: int, x_exact: torch.Tensor) -> torch.Tensor:
        view = self.inner.view(step, index, x_exact)
        if self.hooks.prefix_state is None or self.absent or not 0 < view.prefix_end < step.n:
            return self.inner.scan(view)
        return scan_with_prefix_state(view, self.hooks.prefix_state)[:, step.rows.exact]


def row_fill_for(plan: Plan, fill: FillFn | RowFill | None, hooks: LateLayerHooks | None = None) -> RowFill:
    """The strategy for `plan`: `fill` itself if it is one; a bare fill function is a fill from predicted
    inputs (`PredictedInput`). The engine knows strategies, not fill names: a fill of another
    strategy hands its own (`rf_eval.fills.fill_named(name).row_fill(fn)`; `AbsentRows()` for nofill).

    `hooks` wrap it (`Corrected`).
    """
    if isinstance(fill, RowFill):
        strategy = fill
    elif plan.fill == MAPPED:
        raise ValueError(f"fill {MAPPED!r} needs its mapped keys and values: pass fill=MappedKV(...)")
    elif plan.fill == FILL_OFF or fill is not None:
        strategy = PredictedInput(fill)  # fill off: no filled row reads it
    else:
        raise ValueError(f"fill {plan.fill!r} has no fill function or strategy: pass fill=, its method's "
                         f"row_fill (rf_eval.fills.fill_named({plan.fill!r}).row_fill(fn))")
    return strategy if hooks is None else Corrected(strategy, hooks)
