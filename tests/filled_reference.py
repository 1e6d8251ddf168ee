"""An engine-free reference for a partial prefill: the stock forward, told which prompt rows are filled.

RidgeFill paper section 2.1: in a late layer l >= S a filled prompt row contributes only what later rows
read (its K/V; its Gated DeltaNet state update), computed by the layer from x̂_l = fill(l, x_S), and the
exact rows run the layer over those contributions. The stock `transformers` forward computes exactly that
when a pre-hook on each late layer overwrites the filled rows' input with x̂_l: the layer's own modules
write the filled rows' K/V (or scan their update) from x̂_l, the exact rows attend over them, and whatever
the layer computes for a filled row is overwritten by the next layer's hook. Other arms are the same
forward with one more change:

- `kv`: a late attention layer's K/V pass through `kv(layer, k, v)` before they enter the cache (mapped
  rows, splices, rescales);
- `absent` (nofill): late attention layers mask the filled rows' keys, late Gated DeltaNet layers scan the
  other rows only.

No code of `rf_eval.engine` runs, so the engine's logits and cache can be checked against it: bitwise for
filled rows' K/V (a per-row computation), within the filled-row kernel's floor elsewhere (the engine's
exact rows attend through a masked SDPA over the key rows, the stock layer with `is_causal`;
tests/engine/test_engine_floor.py measures it at <= 1e-5 in fp32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: x̂_l for the filled rows from their split states: (layer, x_S rows (1, k, d)) -> (1, k, d)
Predict = Callable[[int, torch.Tensor], torch.Tensor]
#: a late attention layer's (rotated) keys and values for every row of the pass -> what enters the cache
KV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
#: the filled-row kernel's floor in fp32 (tests/engine/test_engine_floor.py), with room for a few more layers
FLOOR = 1e-5


def affine(maps) -> Predict:
    """x̂_l = A_l x_S + b_l from a `RidgeMaps`' own tensors (not through the product's `fill_fn`)."""
    return lambda layer, x: x @ maps.A[layer].to(x.dtype).T + maps.b[layer].to(x.dtype)


def split_state(_layer: int, x: torch.Tensor) -> torch.Tensor:
    """The identity fill: every late layer reads x_S."""
    return x


class _Cache(DynamicCache):
    """The model's own cache, passing late attention layers' K/V through `kv` during the prompt pass."""

    def __init__(self, config, late: set[int], kv: KV | None):
        super().__init__(config=config)
        self.late, self.kv = late, kv

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.kv is not None and layer_idx in self.late:
            key_states, value_states = self.kv(layer_idx, key_states.clone(), value_states.clone())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args, kwargs, hidden):
    return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})


@torch.no_grad()
def reference(model, ids: torch.Tensor, split: int, filled: torch.Tensor, predict: Predict | None = None, *,
              map_split: bool = False, kv: KV | None = None, absent: bool = False):
    """The stock forward of `ids` (1 x M: a prompt, then optionally a continuation that runs every layer
    exactly, as it does after a prefill) with prompt rows `filled` filled in layers split..L-1.

    `predict`: the filled rows' input to each late layer (layer `split` reads x_S itself unless
    `map_split`); None leaves their inputs alone (their contribution then comes from `kv`). `absent`
    assumes full-attention layers (nofill is refused where a layer has a sliding window).
    Returns (logits of every row (1, M, V), the model's cache after the pass).
    """
    layers = model.model.layers
    m = ids.shape[1]
    late = range(split, len(layers))
    kept = torch.ones(m, dtype=torch.bool)
    kept[filled] = False
    x_split = {}
    handles, patched = [], []

    def hook(index):
        def pre(_module, args, kwargs):
            hidden = _hidden(args, kwargs)
            if index == split:
                x_split["x"] = hidden[:, filled].clone()
            if absent and hasattr(layers[index], "self_attn"):
                causal = torch.ones(m, m, dtype=torch.bool).tril()
                mask = causal & (kept[None, :] | torch.eye(m, dtype=torch.bool))  # a filled query sees itself only
                kwargs = {**kwargs, "attention_mask": mask[None, None]}
            if predict is not None and (index > split or map_split):
                hidden = hidden.clone()
                hidden[:, filled] = predict(index, x_split["x"])
            return _with_hidden(args, kwargs, hidden)
        return pre

    def scan_kept_rows(mixer):
        stock = mixer.forward

        def forward(hidden_states, *args, **kwargs):
            out = stock(hidden_states[:, kept], *args, **{**kwargs, "attention_mask": None})
            full = out.new_zeros((*hidden_states.shape[:2], out.shape[-1]))
            full[:, kept] = out
            return full
        return forward

    for index in late:
        handles.append(layers[index].register_forward_pre_hook(hook(index), with_kwargs=True))
        if absent and hasattr(layers[index], "linear_attn"):
            mixer = layers[index].linear_attn
            mixer.forward = scan_kept_rows(mixer)
            patched.append(mixer)
    cache = _Cache(model.config, {i for i in late if hasattr(layers[i], "self_attn")}, kv)
    try:
        out = model(input_ids=ids, cache=cache, use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
        for mixer in patched:
            del mixer.forward
    cache.kv = None  # what reads the cache afterwards is the stock model
    return out.logits, cache


@torch.no_grad()
def stock_kv(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Every layer's stock K/V of every prompt row (sliding-window layers too), None for recurrent layers."""
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    model(input_ids=ids, cache=cache, use_cache=True)
    return [(layer.keys, layer.values) if isinstance(getattr(layer, "keys", None), torch.Tensor) else None
            for layer in cache.layers]


def named_tensors(cache) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a cache holds, named `layer L keys` etc. (Gated DeltaNet states included)."""
    out = []
    for index, layer in enumerate(cache.layers):
        for name in ("keys", "values", "conv_states", "recurrent_states"):
            value = getattr(layer, name, None)
            if isinstance(value, dict):
                out.extend((f"layer {index} {name}[{k}]", value[k]) for k in sorted(value)
                           if isinstance(value[k], torch.Tensor))
            elif isinstance(value, torch.Tensor):
                out.append((f"layer {index} {name}", value))
    return out


def assert_matches(engine_cache, engine_logits, ref_cache, ref_logits, filled: torch.Tensor, split: int, *,
                   kept: torch.Tensor | None = None, bitwise: bool = True, atol: float = FLOOR) -> None:
    """The engine's cache and logits against `reference`'s.

    Every tensor within `atol`; with `bitwise`, late layers' K/V of the filled rows bitwise equal (in
    layers that hold every row). `kept`: the rows the engine's late attention layers hold (nofill: all but
    the filled rows); None: every row.
    """
    a, b = named_tensors(engine_cache), named_tensors(ref_cache)
    assert [name for name, _ in a] == [name for name, _ in b] and a
    every_row = max(x.shape[2] for name, x in b if name.endswith("keys"))
    for (name, x), (_, y) in zip(a, b):
        index, is_kv = int(name.split()[1]), name.endswith(("keys", "values"))
        if is_kv and index >= split and kept is not None:
            y = y[:, :, kept]
        assert x.shape == y.shape, (name, x.shape, y.shape)
        if bitwise and is_kv and index >= split and kept is None and y.shape[2] == every_row:
            assert torch.equal(x[:, :, filled], y[:, :, filled]), f"{name}: filled rows differ"
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(engine_logits, ref_logits, rtol=0, atol=atol)
