"""The partial-prefill engine: one prompt in, the model's own cache out.

RidgeFill paper section 2.1. Layers 0..S-1 run exactly for every row (the
model's own forward, stopped at layer S). In each late layer l >= S a prompt
row is *exact* (the last `tail` rows and any selected prefix rows) or
*filled*: its input is predicted from its split state, x̂_l = fill(l, x_S),
and from x̂_l the layer computes only what later rows read (keys and values
in an attention layer; the recurrent and conv state update in a Gated
DeltaNet layer). Queries, attention output and the MLP run for exact rows
only. The result is the model's own `transformers` cache plus the last
prompt row's logits; everything after the prompt is the stock model.

Layer S itself receives the true x_S for every row (it is already computed
exactly, so its filled rows' keys and values are exact). The fitted map for
layer S is still saved with the others (the paper's release keeps it).

With no filled rows (fill `exact`, or tail >= N) the engine is the plain
model forward, so logits and cache are bitwise those of `transformers`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from rf_eval.families import Family, family_for
from rf_eval.hooks import LateLayerHooks, LayerView, Selection

FILL_SOURCES = ("exact", "nofill", "identity", "ridge")


@dataclass(frozen=True)
class Plan:
    """How to prefill one prompt.

    split: first late layer S (1..L-1). tail: count of last prompt rows kept
    exact in every layer. fill: one of FILL_SOURCES. exact_rows: prefix rows
    (< N - tail) also kept exact in the late layers. chunk_size: run the lower
    layers in chunks of this many rows (None: one pass; bitwise equal to the
    plain model). query_chunk: exact-row queries per attention call in the late
    layers (bounds the mask's memory).
    """

    split: int
    tail: int
    fill: str = "exact"
    chunk_size: int | None = None
    query_chunk: int = 4096

    def __post_init__(self):
        if self.fill not in FILL_SOURCES:
            raise ValueError(f"unknown fill {self.fill!r}; valid fills: {', '.join(FILL_SOURCES)}")
        if self.tail < 1:
            raise ValueError(f"tail must be >= 1 (the last prompt row is always exact), got {self.tail}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {self.chunk_size}")


@dataclass
class LayerInputs:
    """What the engine knows after the lower layers: split states and RoPE tables."""

    x_split: torch.Tensor  # (1, N, d): hidden state entering layer S, every row
    cos: torch.Tensor  # (1, N, rope_dim)
    sin: torch.Tensor


@dataclass
class PrefillResult:
    """The prompt's cache (the model's own type) and its last row's logits (1, vocab)."""

    cache: DynamicCache
    logits: torch.Tensor
    exact_rows: torch.Tensor  # late-layer exact rows (selected prefix rows + tail), sorted
    timings: dict[str, float] = field(default_factory=dict)
    prompt_length: int = 0
    #: True when late layers hold fewer rows than the prompt (nofill): see `extend`
    ragged: bool = False
    #: the plan that ran (a selector may lengthen the tail: the longer-tail control)
    plan: Plan | None = None


# A fill function maps (late layer index, split states of the filled rows) to that layer's predicted input.
FillFn = Callable[[int, torch.Tensor], torch.Tensor]

SelectFn = Callable[["PrefillContext"], torch.Tensor]
# A cache-to-cache fill: (layer index, filled rows) -> that layer's keys (rotated) and values for those rows.
KVFillFn = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


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
    #: Filled keys/values a selector already computed (the probe's sweep), for the late layers to reuse.
    filled_kv: FilledKV | None = None


@dataclass
class FilledKV:
    """Keys (rotated) and values of late attention layers for prompt rows 0..rows-1, from the fill.

    `kv[l]` is a pair of (1, kv_heads, N, head_dim) tensors whose first `rows`
    rows hold what layer l writes for a filled row; the engine writes the exact
    rows into the same tensors, so sharing costs no memory beyond the cache.
    """

    rows: int
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class _StopAtSplit(Exception):
    def __init__(self, hidden_states: torch.Tensor, kwargs: dict):
        super().__init__("stopped at split")
        self.hidden_states = hidden_states
        self.kwargs = kwargs


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def num_layers(model: nn.Module) -> int:
    return len(decoder_layers(model))


def new_cache(model: nn.Module) -> DynamicCache:
    return DynamicCache(config=model.config)


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


def run_lower_layers(
    model: nn.Module,
    input_ids: torch.Tensor,
    split: int,
    cache: DynamicCache,
    chunk_size: int | None = None,
    capture: dict[int, slice] | None = None,
) -> tuple[LayerInputs, dict[int, torch.Tensor]]:
    """Run layers 0..split-1 of the model's own forward over every prompt row.

    The forward stops when it reaches layer `split` (a pre-hook raises), so the
    lower layers' caches are written by the stock code. `capture` maps a lower
    layer index to the rows whose input to that layer should be kept.
    """
    layers = decoder_layers(model)
    captured: dict[int, list[torch.Tensor]] = {i: [] for i in capture or {}}
    handles = []

    def stop(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        raise _StopAtSplit(hidden, kwargs)

    def keep(index):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[index].append(hidden)

        return hook

    handles.append(layers[split].register_forward_pre_hook(stop, with_kwargs=True))
    for index in captured:
        handles.append(layers[index].register_forward_pre_hook(keep(index), with_kwargs=True))
    n = input_ids.shape[1]
    step = n if chunk_size is None else chunk_size
    states, cos, sin = [], [], []
    try:
        for start in range(0, n, step):
            chunk = input_ids[:, start : start + step]
            try:
                model.model(input_ids=chunk, cache=cache, use_cache=True)
            except _StopAtSplit as stopped:
                states.append(stopped.hidden_states)
                c, s = stopped.kwargs["position_embeddings"]
                cos.append(c)
                sin.append(s)
            else:  # pragma: no cover - the hook always fires
                raise RuntimeError("the forward pass did not reach the split layer")
    finally:
        for handle in handles:
            handle.remove()
    inputs = LayerInputs(torch.cat(states, 1), torch.cat(cos, -2), torch.cat(sin, -2))
    lower = {}
    for index, pieces in captured.items():
        rows = capture[index]
        lower[index] = torch.cat(pieces, 1)[:, rows]
    return inputs, lower


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of queries at positions q_pos over keys at k_pos -> (B, n, heads*D)."""
    mask = k_pos[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


#: Queries per attention call for exact rows inside the prefix (selected rows).
PREFIX_QUERY_CHUNK = 64


def attend_exact_rows(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float,
    query_chunk: int,
    prefix_end: int,
) -> torch.Tensor:
    """Causal attention of the exact rows (sorted positions q_pos) over the cache's keys (sorted k_pos).

    A masked SDPA call computes scores against every key it is given, so a
    selected row early in the prompt would pay for the whole context. Rows
    before `prefix_end` therefore go in small chunks, each given only the keys
    up to its last query's position: the work follows the causal triangle, as
    the cost model charges it (paper section 4.4 on scattered exact rows).
    Rows from `prefix_end` on (the tail) go in chunks of `query_chunk` over
    every key, as before. Dropping keys that every query in a chunk masks
    out changes nothing but the summation's length.
    """
    n_q = q.shape[2]
    n_prefix = int(torch.searchsorted(q_pos, prefix_end).item()) if n_q else 0
    bounds = [(i, min(i + PREFIX_QUERY_CHUNK, n_prefix)) for i in range(0, n_prefix, PREFIX_QUERY_CHUNK)]
    bounds += [(i, min(i + query_chunk, n_q)) for i in range(n_prefix, n_q, query_chunk)]
    if not bounds:
        return q.new_empty((q.shape[0], 0, q.shape[1] * values.shape[-1]))
    last_pos = q_pos[torch.tensor([stop - 1 for _, stop in bounds], device=q_pos.device)]
    key_ends = torch.searchsorted(k_pos, last_pos, right=True).tolist()
    pieces = []
    for (start, stop), end in zip(bounds, key_ends):
        if start >= n_prefix:
            end = k_pos.numel()  # tail chunks: every key (the mask does the rest), as the plain path
        pieces.append(
            _attend(q[:, :, start:stop], keys[:, :, :end], values[:, :, :end], q_pos[start:stop], k_pos[:end], scale)
        )
    return torch.cat(pieces, 1)


def late_layers(
    model: nn.Module,
    family: Family,
    plan: Plan,
    inputs: LayerInputs,
    cache: DynamicCache,
    exact: torch.Tensor,
    fill: FillFn | None,
    kv_fill: KVFillFn | None = None,
    hooks: LateLayerHooks | None = None,
    filled_kv: FilledKV | None = None,
) -> torch.Tensor:
    """Run layers S..L-1 with exact rows `exact` and every other row filled (or absent for nofill).

    With `kv_fill` the filled rows' keys and values come from it directly (a
    cache-to-cache map, as RaReCache does) instead of from a predicted input.
    `hooks` (see `LateLayerHooks`) apply to the fill path, not to `kv_fill`.
    `filled_kv`: filled rows' K/V already computed from the same fill (the
    probe's first sweep); used where they cover every filled row and no hook
    changes K/V, so those rows are not computed twice.
    Returns the last layer's output for the exact rows, (1, |exact|, d).
    """
    if hooks is not None and kv_fill is not None:
        raise ValueError("late-layer hooks apply to a fill from predicted inputs, not to kv_fill")
    layers = decoder_layers(model)
    x_split = inputs.x_split
    n = x_split.shape[1]
    device = x_split.device
    is_filled = torch.ones(n, dtype=torch.bool, device=device)
    is_filled[exact] = False
    filled = is_filled.nonzero().squeeze(1)
    absent = plan.fill == "nofill"
    x_filled_split = x_split[:, filled]
    key_rows = exact if absent else torch.arange(n, device=device)
    cos_k, sin_k = inputs.cos[:, key_rows], inputs.sin[:, key_rows]
    cos_q, sin_q = inputs.cos[:, exact], inputs.sin[:, exact]
    x_exact = x_split[:, exact]
    reuse = (
        filled_kv is not None and not absent and hooks is None
        and (filled.numel() == 0 or int(filled[-1]) < filled_kv.rows)
    )

    for index in range(plan.split, len(layers)):
        layer = layers[index]
        if reuse and index in filled_kv.kv:
            x_exact = _exact_rows_over_mapped_cache(
                family, layer, index, x_exact, exact, None, None, cache, cos_q, sin_q, n, plan.query_chunk,
                n - plan.tail, into=filled_kv.kv.pop(index),
            )
            continue
        if kv_fill is not None:
            if family.is_recurrent(layer):
                raise ValueError("a cache-to-cache fill needs attention layers; this model has recurrent layers")
            x_exact = _exact_rows_over_mapped_cache(
                family, layer, index, x_exact, exact, filled, kv_fill, cache, cos_q, sin_q, n, plan.query_chunk,
                n - plan.tail,
            )
            continue
        # The layer's input for every row it sees, in prompt order.
        if absent:
            x_in = x_exact
        else:
            x_in = torch.empty_like(x_split)
            x_in[:, filled] = x_filled_split if index == plan.split else fill(index, x_filled_split)
            x_in[:, exact] = x_exact
        h = layer.input_layernorm(x_in)
        view = None
        if hooks is not None:
            view = LayerView(index, layer, family, plan, x_in, h, key_rows, exact, filled, inputs, fill)
        if family.is_recurrent(layer):
            # Gated DeltaNet: the stock mixer scans every row in order, so its conv and
            # recurrent state carry the predicted inputs of filled rows and the true
            # inputs of exact rows; only the exact rows' outputs are kept.
            if view is not None and hooks.prefix_state is not None and not absent and 0 < view.prefix_end < n:
                mixed = _scan_with_prefix_state(layer, h, cache, index, view, hooks.prefix_state)
            else:
                mixed = layer.linear_attn(hidden_states=h, cache=cache, attention_mask=None)
            mixed_exact = mixed if absent else mixed[:, exact]
        else:
            attn = layer.self_attn
            k, v = family.kv(attn, h, cos_k, sin_k)
            if view is not None and hooks.kv is not None:
                k, v = hooks.kv(view, k, v)
            keys, values = cache.update(k, v, index)
            h_exact = h if absent else h[:, exact]
            q, gate = family.query(attn, h_exact, cos_q, sin_q)
            context = attend_exact_rows(
                q, keys, values, exact, key_rows, attn.scaling, plan.query_chunk, n - plan.tail
            )
            mixed_exact = family.attention_output(attn, context, gate)
        x_exact = family.mlp(layer, x_exact + mixed_exact)
    return x_exact


def _scan_with_prefix_state(layer, h, cache, index, view, prefix_state) -> torch.Tensor:
    """The stock Gated DeltaNet mixer over the prefix, then `prefix_state` on its state, then the tail.

    The conv and recurrent state carry across the two calls (the cache's own
    continuation path), so with an identity `prefix_state` this equals one scan
    up to rounding.
    """
    end = view.prefix_end
    first = layer.linear_attn(hidden_states=h[:, :end], cache=cache, attention_mask=None)
    state = cache.get_recurrent_state(index)
    cache.update_recurrent_state(prefix_state(view, state).to(state.dtype), index)
    second = layer.linear_attn(hidden_states=h[:, end:], cache=cache, attention_mask=None)
    return torch.cat([first, second], 1)


def _exact_rows_over_mapped_cache(family, layer, index, x_exact, exact, filled, kv_fill, cache, cos_q, sin_q, n,
                                  query_chunk, prefix_end, into=None):
    """One attention layer whose filled rows' K/V come from `kv_fill`; exact rows run the layer.

    `into`: full-length K/V tensors already holding the filled rows (then
    `filled` is None and only the exact rows are written).
    """
    attn = layer.self_attn
    h_exact = layer.input_layernorm(x_exact)
    k_exact, v_exact = family.kv(attn, h_exact, cos_q, sin_q)
    if into is None:
        k_filled, v_filled = kv_fill(index, filled)
        k = k_exact.new_empty((*k_exact.shape[:2], n, k_exact.shape[-1]))
        v = v_exact.new_empty((*v_exact.shape[:2], n, v_exact.shape[-1]))
        k[:, :, filled], v[:, :, filled] = k_filled.to(k), v_filled.to(v)
    else:
        k, v = into
    k[:, :, exact], v[:, :, exact] = k_exact.to(k), v_exact.to(v)
    keys, values = cache.update(k, v, index)
    q, gate = family.query(attn, h_exact, cos_q, sin_q)
    key_rows = torch.arange(n, device=x_exact.device)
    context = attend_exact_rows(q, keys, values, exact, key_rows, attn.scaling, query_chunk, prefix_end)
    mixed = family.attention_output(attn, context, gate)
    return family.mlp(layer, x_exact + mixed)


def runs_plain(plan: Plan, n: int, selects: bool) -> bool:
    """True when `prefill` of an n-row prompt is the plain model's forward, bitwise.

    That is when no row is filled (fill exact, or the tail covers the prompt),
    the lower layers run in one pass, and no selector may lengthen the tail.
    """
    return (plan.fill == "exact" or plan.tail >= n) and plan.chunk_size is None and not selects


def exact_row_set(n: int, plan: Plan, selected: torch.Tensor | None, device) -> torch.Tensor:
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
    fill: FillFn | None = None,
    select: SelectFn | None = None,
    capture: dict[int, slice] | None = None,
    kv_fill: KVFillFn | None = None,
    hooks: LateLayerHooks | None = None,
) -> PrefillResult:
    """Prefill `input_ids` (1 x N) under `plan`; see the module docstring.

    `kv_fill` (a cache-to-cache fill) allows split 0: every layer reads mapped
    K/V for its filled rows and runs only the exact rows. `select` returns
    prefix rows, or a `Selection` (rows and a new tail). `hooks`: corrections
    and splices inside the late layers (`LateLayerHooks`).
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be a 1 x N tensor, got shape {tuple(input_ids.shape)}")
    n_layers = num_layers(model)
    lowest = 0 if kv_fill is not None else 1
    if not lowest <= plan.split <= n_layers - 1:
        raise ValueError(
            f"split {plan.split} is outside {lowest}..{n_layers - 1} for this {n_layers}-layer model"
        )
    if plan.fill in ("identity", "ridge") and fill is None and kv_fill is None:
        raise ValueError(f"fill {plan.fill!r} needs a fill function (maps for 'ridge')")
    n = input_ids.shape[1]
    if runs_plain(plan, n, select is not None):
        return plain_prefill(model, input_ids)
    no_filled_rows = plan.fill == "exact" or plan.tail >= n

    family = family_for(model.config)
    t0 = time.perf_counter()
    cache = new_cache(model)
    inputs, lower = run_lower_layers(model, input_ids, plan.split, cache, plan.chunk_size, capture)
    t1 = time.perf_counter()
    selected, filled_kv = None, None
    if select is not None:
        ctx = PrefillContext(model, family, input_ids, plan, inputs, cache, lower)
        selected = select(ctx)
        filled_kv = ctx.filled_kv
        if isinstance(selected, Selection):
            if selected.tail is not None:
                plan = dataclasses.replace(plan, tail=max(1, min(int(selected.tail), n)))
                no_filled_rows = no_filled_rows or plan.tail >= n
            selected = selected.rows
    exact = exact_row_set(n, plan, selected, input_ids.device)
    if no_filled_rows:
        exact = torch.arange(n, device=input_ids.device)
    t2 = time.perf_counter()
    x_exact = late_layers(model, family, plan, inputs, cache, exact, fill, kv_fill, hooks, filled_kv)
    last = model.model.norm(x_exact[:, -1:])
    logits = model.lm_head(last)[:, -1]
    t3 = time.perf_counter()
    return PrefillResult(
        cache=cache,
        logits=logits,
        exact_rows=exact,
        timings={"lower": t1 - t0, "select": t2 - t1, "late": t3 - t2, "total": t3 - t0},
        prompt_length=n,
        ragged=plan.fill == "nofill" and exact.numel() < n,
        plan=plan,
    )


@torch.no_grad()
def extend(model: nn.Module, result: PrefillResult, tokens: torch.Tensor) -> torch.Tensor:
    """The stock model over `tokens` (1 x k) after a prefilled prompt: their logits (1, k, V).

    Advances `result.cache` and `result.prompt_length`. A ragged cache (late
    layers shorter than the prompt) is extended one token at a time: a single
    query needs no mask, so each layer attends to exactly the rows it holds.
    """
    start = result.prompt_length
    k = tokens.shape[1]
    positions = torch.arange(start, start + k, device=tokens.device)[None]
    if not result.ragged or k == 1:
        out = model(input_ids=tokens, cache=result.cache, use_cache=True, position_ids=positions)
        logits = out.logits
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
