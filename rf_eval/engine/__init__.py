"""The partial-prefill engine: one prompt in (or several of one length: `batch`), the model's own cache out.

RidgeFill paper section 2.1. Layers 0..S-1 run exactly for every row (the
model's own forward, stopped at layer S: `lower`). In each late layer l >= S
a prompt row is *exact* (the last `tail` rows and any selected prefix rows)
or *filled*; a row-fill strategy (`rowfill.RowFill`, implementations in
`strategies`) supplies what a filled row contributes: keys and values in an
attention layer, the conv and recurrent state update in a Gated DeltaNet
layer. For the predicted-input fill its input is x̂_l = fill(l, x_S).
Queries, attention output and the MLP run for exact rows only (`layers`).
The result is the model's own `transformers` cache plus the last prompt
row's logits; everything after the prompt is the stock model.

Layer S reads the true x_S for every row by default, so its filled rows' keys
and values are exact (`plan.DEFAULT_MAP_SPLIT`). With `Plan.map_split` its
filled rows read x̂_S = fill(S, x_S), as the paper's released maps (layers
S..L-1) and its MAC counts (section 2.2 "Size and cost", section 2.5) have
it. The identity fill is x_S either way.

A prompt with no filled row (fill `exact`, or tail >= N) is the plain model's
forward, bitwise those of `transformers`: its method's plan says so once
(`rf_eval.methods.base.Method.plan`) and runs `plain_prefill`; `prefill` itself
always runs the partial path. That path with every row exact (a selector that
selects every prefix row, or a plan with no filled row) is bitwise the stock
model too: each late layer then calls the
stock layer's own attention function with the stock mask (`floor`, the
engine floor of paper sections 4.3 and 9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
from torch import nn

from rf_eval.engine.attention import PREFIX_QUERY_CHUNK, QueryChunks, attend_exact_rows
from rf_eval.engine.batch import check_batch, last_row_logits, split_batch
from rf_eval.engine.context import PrefillContext, SelectFn, Selection
from rf_eval.engine.floor import (
    FILLED_KERNEL_WHY,
    PARTIAL_WHY,
    Floor,
    compare_results,
    every_prefix_row,
    filled_kernel_every_row_exact,
    named_cache_tensors,
)
from rf_eval.engine.kv_strategies import EveryRowKV, MappedKV, PredictedKV
from rf_eval.engine.layers import late_layers, run_layer, run_layers
from rf_eval.engine.lower import decoder_layers, new_cache, num_layers, run_lower_layers
from rf_eval.engine.plan import (
    EVERY_ROW_EXACT,
    FILL_OFF,
    MAPPED,
    FillFn,
    KVFillFn,
    LayerInputs,
    Plan,
    PrefillResult,
    check_split,
)
from rf_eval.engine.rowfill import AttentionRows, RowFill
from rf_eval.engine.shared_lower import run_shared_lower_layers
from rf_eval.engine.step import LayerStep, Rows
from rf_eval.engine.strategies import (
    AbsentRows,
    Corrected,
    LateLayerHooks,
    LayerView,
    Precomputed,
    PredictedInput,
    exact_rows_beside,
    row_fill_for,
)
from rf_eval.families import execution_device, family_for, sliding_window

__all__ = [
    "FILL_OFF", "MAPPED", "PREFIX_QUERY_CHUNK", "AbsentRows", "AttentionRows", "Corrected", "EveryRowKV", "FillFn",
    "KVFillFn", "Floor", "LateLayerHooks", "LayerInputs", "LayerStep", "LayerView", "MappedKV", "Plan", "Precomputed",
    "PredictedInput", "PredictedKV", "PrefillContext", "PrefillResult", "QueryChunks", "RowFill", "Rows", "SelectFn", "Selection",
    "attend_exact_rows", "compare_results", "decoder_layers", "engine_floor", "exact_row_set",
    "exact_rows_beside", "execution_device", "extend", "family_for", "filled_kernel_every_row_exact",
    "late_layers", "named_cache_tensors", "new_cache", "num_layers", "partial_every_row_exact",
    "partial_path_floors", "plain_prefill", "prefill", "row_fill_for", "rows_can_be_given_back", "run_layer",
    "run_layers", "run_lower_layers", "split_batch", "without_last_row",
]


@torch.no_grad()
def plain_prefill(model: nn.Module, input_ids: torch.Tensor) -> PrefillResult:
    """The unmodified model's prefill: what every filled arm is compared with.

    `logits_to_keep=1` (the stock way to skip the vocabulary projection of
    every other row) is the reference: an lm_head over all N rows can round
    the last row differently in the last bit.
    """
    t0 = time.perf_counter()
    cache = new_cache(model)
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    n = input_ids.shape[1]
    return PrefillResult(
        cache=cache,
        logits=out.logits[:, -1],
        exact_rows=torch.arange(n, device=input_ids.device),
        timings={"total": time.perf_counter() - t0},
        prompt_length=n,
    )


def exact_row_set(n: int, plan: Plan, selected: torch.Tensor | None, device: torch.device | str | None) -> torch.Tensor:
    """Sorted late-layer exact rows: the tail plus selected prefix rows (tail rows never selected)."""
    prefix_end = max(n - plan.tail, 0)
    rows = [torch.arange(prefix_end, n, device=device)]
    if selected is not None and selected.numel():
        sel = selected.to(device=device, dtype=torch.long)
        if (sel < 0).any() or (sel >= prefix_end).any():
            bad = sel[(sel < 0) | (sel >= prefix_end)][:5].tolist()
            raise ValueError(f"exact rows must lie in the prefix 0..{prefix_end - 1}; got {bad}")
        rows.append(sel)
    return torch.unique(torch.cat(rows))


@torch.no_grad()
def prefill(
    model: nn.Module,
    input_ids: torch.Tensor,
    plan: Plan,
    fill: FillFn | RowFill | None = None,
    select: SelectFn | None = None,
    capture: dict[int, slice] | None = None,
    hooks: LateLayerHooks | None = None,
) -> PrefillResult:
    """Prefill `input_ids` (1 x N) under `plan`; see the module docstring.

    `fill`: a fill function for the plan's identity/ridge fill, or a row-fill
    strategy (e.g. `MappedKV` for fill `mapped`, which allows split 0: every
    layer reads mapped K/V for its filled rows and runs only the exact rows).
    `select` returns prefix rows, or a `Selection` (rows, a new tail, a
    strategy to lay over this one). `hooks`: corrections and splices, which
    wrap the strategy (`Corrected`).

    B x N prompts of one length run together (`rf_eval.engine.batch`) when their
    rows are the plan's alone: no selector, no hooks, and at least one filled row.
    """
    check_batch(input_ids, plan, select is not None or hooks is not None)
    strategy = row_fill_for(plan, fill, hooks)
    n_layers = num_layers(model)
    check_split(plan.split, n_layers, strategy.min_split)
    n = input_ids.shape[1]
    no_filled_rows = plan.fills_no_row(n)

    family = family_for(model.config)
    t0 = time.perf_counter()
    cache = new_cache(model)
    inputs, lower, reused = run_shared_lower_layers(model, input_ids, plan.split, cache, plan.chunk_size, capture)
    t1 = time.perf_counter()
    selected = None
    if select is not None:
        selected = select(PrefillContext(model, family, input_ids, plan, inputs, cache, lower))
        if isinstance(selected, Selection):
            if selected.tail is not None:
                plan = dataclasses.replace(plan, tail=max(min(plan.tail, 1), min(int(selected.tail), n)))
                no_filled_rows = no_filled_rows or plan.fills_no_row(n)
            if selected.fill is not None:
                strategy = selected.fill.over(strategy)
            selected = selected.rows
    exact = exact_row_set(n, plan, selected, input_ids.device)
    if no_filled_rows:
        exact = torch.arange(n, device=input_ids.device)
    t2 = time.perf_counter()
    x_exact = late_layers(model, family, plan, inputs, cache, exact, strategy)
    logits = last_row_logits(model, family, x_exact)
    t3 = time.perf_counter()
    return PrefillResult(
        cache=cache,
        logits=logits,
        exact_rows=exact,
        timings={"lower": t1 - t0, "select": t2 - t1, "late": t3 - t2, "total": t3 - t0, "reused": reused},
        prompt_length=n,
        ragged=strategy.absent and exact.numel() < n,
        plan=plan,
    )


@torch.no_grad()
def partial_every_row_exact(model: nn.Module, input_ids: torch.Tensor, split: int) -> PrefillResult:
    """`prefill` forced onto its partial path: tail 1, every prefix row selected exact (`floor`)."""
    plan = Plan(split, tail=1, fill=EVERY_ROW_EXACT)  # a fill that is never read: every row is exact
    return prefill(model, input_ids, plan, fill=PredictedInput(None), select=every_prefix_row)


def partial_path_floors(model: nn.Module, input_ids: torch.Tensor, split: int) -> tuple[Floor, Floor]:
    """(partial path, filled-row kernel) `Floor`s of one prompt against `plain_prefill` (paper sections 4.3, 9)."""
    stock = plain_prefill(model, input_ids)
    partial = compare_results(stock, partial_every_row_exact(model, input_ids, split), PARTIAL_WHY)
    kernel = compare_results(stock, filled_kernel_every_row_exact(model, input_ids, split), FILLED_KERNEL_WHY)
    return partial, kernel


def engine_floor(model: nn.Module, input_ids: torch.Tensor, split: int) -> dict:
    """Both floors of one prompt: `{bitwise, max_abs, kl, first_diff, why, filled_kernel: {...}}`.

    The top level is the partial path (`partial_every_row_exact`); `filled_kernel`
    the exact rows' attention that filled arms use (`filled_kernel_every_row_exact`).
    """
    partial, kernel = partial_path_floors(model, input_ids, split)
    return {**partial.as_dict(), "filled_kernel": kernel.as_dict()}


@torch.no_grad()
def extend(model: nn.Module, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
    """The stock model over `tokens` (1 x k) after a prefilled prompt: their logits (1, k, V).

    Advances `result.cache` and `result.prompt_length`. A ragged cache (late
    layers shorter than the prompt) cannot take the stock mask, which is as long
    as the lower layers' cache: under SDPA each attention layer is handed a mask
    of its own length instead (`own_length_masks`: every cached row, then the new
    tokens causally), so each layer attends to exactly the rows it holds; under
    other kernels, or with sliding-window layers (whose caches keep a window),
    the tokens go one at a time (a single query needs no mask).
    """
    start = result.prompt_length
    k = tokens.shape[1]
    positions = torch.arange(start, start + k, device=tokens.device)[None]
    own_masks = model.config._attn_implementation == "sdpa" and sliding_window(model.config) is None
    if not result.ragged or k == 1 or own_masks:
        with own_length_masks(model, result.cache, k) if result.ragged and k > 1 else contextlib.nullcontext():
            logits = model(input_ids=tokens, cache=result.cache, use_cache=True, position_ids=positions).logits
    else:
        steps = [
            model(
                input_ids=tokens[:, i : i + 1], cache=result.cache, use_cache=True, position_ids=positions[:, i : i + 1]
            ).logits
            for i in range(k)
        ]
        logits = torch.cat(steps, 1)
    result.prompt_length = start + k
    return logits


def rows_can_be_given_back(config) -> bool:
    """Whether a model of `config` holds every layer's cache as its rows (no Gated DeltaNet state, no sliding
    window): a prefill's last row can be taken back out of it (`without_last_row`), and FastKV's capacity can
    cut it (`rf_eval.drop.fastkv_capacity`). One rule, read from the config, so an arm is checked before the
    weights load."""
    return sliding_window(config) is None and "linear_attention" not in (getattr(config, "layer_types", None) or [])


def without_last_row(result: PrefillResult) -> PrefillResult:
    """`result` with the prompt's last row taken out of every layer's cache (the last row each layer holds):
    the cache of the prompt but its last token, which a generation then runs (`rows_can_be_given_back`).
    `exact_rows` keeps the row: the prefill ran it, and a method's cost counts it once."""
    for layer in result.cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :-1], layer.values[:, :, :-1]
    result.prompt_length -= 1
    return result


@contextlib.contextmanager
def own_length_masks(model: nn.Module, cache, k: int):
    """While a stock forward runs k new tokens over a ragged cache, give each attention layer the boolean mask
    of its own cache's length (every cached row visible; the new tokens causal among themselves), in place of
    the model's one mask, which is as long as the lower layers' cache (forward pre-hooks; the layers' own code
    runs unchanged)."""
    family = family_for(model.config)

    def hook(index: int):
        def swap(_module, args, kwargs):
            past = cache.layers[index].get_seq_length()
            device = (args[0] if args else kwargs["hidden_states"]).device
            mask = torch.ones(k, past + k, dtype=torch.bool, device=device)
            mask[:, past:] = torch.ones(k, k, dtype=torch.bool, device=device).tril()
            kwargs["attention_mask"] = mask[None, None]
            return args, kwargs

        return swap

    handles = [layer.register_forward_pre_hook(hook(i), with_kwargs=True)
               for i, layer in enumerate(decoder_layers(model)) if not family.is_recurrent(layer)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
