"""Late layers S..L-1: exact rows run the layer, filled rows come from a row-fill strategy (paper section 2.1)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine.lower import decoder_layers
from rf_eval.engine.plan import LayerInputs, Plan
from rf_eval.engine.rowfill import RowFill
from rf_eval.engine.step import AttendFn, LayerStep, Rows
from rf_eval.families import Family, execution_device


def run_layer(step: LayerStep, fill: RowFill, index: int, x_exact: torch.Tensor) -> torch.Tensor:
    """One late layer for the exact rows `step.rows.exact` (input `x_exact`); returns their output.

    An attention layer takes its keys and values at `step.rows.keys` from the
    strategy (which writes the filled rows'), stores them in `step.cache`, and
    runs queries, attention, output projection and MLP for the exact rows only.
    A Gated DeltaNet layer's mixer output for the exact rows also comes from the
    strategy (it scans every row the layer sees). With no exact row the layer
    only writes its cache (a generation prefill at tail 0).
    """
    layer, family = step.layers[index], step.family
    if not step.rows.keys.numel():  # no row reaches this layer (nofill at tail 0): it holds nothing yet
        return x_exact
    if family.is_recurrent(layer):
        mixed = fill.recurrent(step, index, x_exact)
    else:
        attn = layer.self_attn
        h_exact, k, v = fill.attention(step, index, x_exact)
        keys, values = (k, v) if step.cache is None else step.cache.update(k, v, index)
        if not step.rows.exact.numel():  # no exact row (a held-back last token is the tail): the cache is all
            return x_exact
        q, gate = family.query(attn, h_exact, *step.rope_at(index, "exact"))
        context = step.attention(q, keys, values, attn)
        mixed = family.attention_output(attn, context, gate)
    return family.mlp(layer, family.attention_residual(layer, x_exact, mixed))


def run_layers(step: LayerStep, fill: RowFill, x_exact: torch.Tensor) -> torch.Tensor:
    """`run_layer` for every late layer S..L-1 in order; the last one's output for the exact rows.

    Each layer runs where a device map placed it: the sweep's rows and inputs follow it there.
    """
    for index in range(step.plan.split, len(step.layers)):
        step = step.to(execution_device(step.layers[index]))
        x_exact = run_layer(step, fill, index, x_exact.to(step.inputs.x_split.device))
    return x_exact


def late_layers(
    model: nn.Module,
    family: Family,
    plan: Plan,
    inputs: LayerInputs,
    cache: DynamicCache,
    exact: torch.Tensor,
    fill: RowFill,
) -> torch.Tensor:
    """Run layers S..L-1 with exact rows `exact`; every other row is filled by `fill` (or absent: `AbsentRows`).
    The exact rows attend as the engine does, or inside `late_attention(fn)` through `fn`.

    Returns the last layer's output for the exact rows, (1, |exact|, d).
    """
    rows = Rows.of(inputs.x_split.shape[1], exact, fill.absent)
    step = LayerStep(family, decoder_layers(model), plan, inputs, rows, cache, _LATE_ATTENTION.get())
    return run_layers(step, fill, inputs.x_split[:, exact])


_LATE_ATTENTION: ContextVar[AttendFn | None] = ContextVar("rf_eval_late_attention", default=None)


@contextmanager
def late_attention(attend: AttendFn | None) -> Iterator[None]:
    """Inside: the late layers of a prefill (`late_layers`) attend their exact rows through `attend` (None:
    the engine's own); a sparse-attention part of a fill arm (`rf_eval.sparse.fill_part`) sets it, as its lower
    layers' pattern is set through the attention interface (`rf_eval.sparse.attention.sparse_prefill`)."""
    token = _LATE_ATTENTION.set(attend)
    try:
        yield
    finally:
        _LATE_ATTENTION.reset(token)
