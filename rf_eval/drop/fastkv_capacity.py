"""FastKV's per-layer KV capacity: every layer's cache cut to the rows its window attends to most.

The authors' rule (dongwonjo/FastKV, `FastKVCluster.update_kv`: the May 2025
release `baseline/fastkv/fastkv_utils.py`, unchanged in the current
`baselines/fastkv/utils.py` but for the proportional mode): in every layer, the
queries (after RoPE) of the last `window` (8) rows the layer ran attend over its
keys, softmax of the 1/sqrt(d)-scaled logits over every key (causal among the
window rows) in fp32; the weight each key before the window receives is summed
over the window rows, pooled along the tokens (`avg`, or `max` in their current
scripts; kernel 7, padding 3, the padding counted), and summed over the query
heads of each key-value head (`rf_eval.selectors.tsp.window_scores`, which the
TSP layer's ranking reads too, summed over the key-value heads). A layer that ran
at least `capacity` rows keeps, per key-value head, the `capacity - window`
highest-scoring rows and the window (each head its own rows); a layer that ran
fewer keeps them all. `capacity` is 2,048 rows in the release's scripts
(`max_prompt`), or `capacity_share` of the prompt in their proportional mode
(`retain_rate`, 0.1: every layer keeps int(0.1 N); the authors compute the rate
above the TSP layer from the propagated rows, which differs from this by less
than a row). Attention during the prefill reads the full cache: only what the
cache keeps afterwards changes, so the prefill's cost is unchanged and its
`cache_entries` count the kept rows.

Where this differs from the authors' code: their queries are the layer's own,
taken during the prefill; here the window rows (exact in every layer) are run
once more over the cache without them (`compress_to_capacity`), which gives the
same queries up to rounding, so that the engine needs no hook in each layer; the
scoring's dot products are not charged, as no selector's are; scores stay fp32
(theirs are cast back to the model's dtype).
"""

from __future__ import annotations

import torch

from rf_eval.engine import PrefillResult, decoder_layers, extend
from rf_eval.families import family_for
from rf_eval.selectors.tsp import window_scores

__all__ = ["compress_to_capacity", "window_queries"]


@torch.no_grad()
def window_queries(model: torch.nn.Module, result: PrefillResult, ids: torch.Tensor, window: int
                   ) -> dict[int, torch.Tensor]:
    """Each attention layer's rotated queries of the prompt's last `window` rows (1, H, w, D): the window run
    once more over the cache without it (every layer holds the window as its last rows). Leaves the cache
    holding the window again (recomputed); the caller puts back its own."""
    cache, family, layers = result.cache, family_for(model.config), decoder_layers(model)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :-window], layer.values[:, :, :-window]
    queries: dict[int, list[torch.Tensor]] = {}

    def grab(index: int):
        def hook(module, args, kwargs):  # one call, or one per row where `extend` runs them one at a time
            cos, sin = kwargs["position_embeddings"]
            queries.setdefault(index, []).append(family.query(module, kwargs["hidden_states"], cos, sin)[0])

        return hook

    handles = [layer.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        n = ids.shape[1]
        extend(model, PrefillResult(cache, result.logits, result.exact_rows, prompt_length=n - window, ragged=True),
               ids[:, n - window:])
    finally:
        for handle in handles:
            handle.remove()
    return {index: torch.cat(parts, 2) for index, parts in queries.items()}


@torch.no_grad()
def compress_to_capacity(model: torch.nn.Module, result: PrefillResult, ids: torch.Tensor, capacity: int, *,
                         window: int, kernel: int, pooling: str) -> PrefillResult:
    """`result` with every layer that ran at least `capacity` rows cut to `capacity` per key-value head (the
    module docstring); the others kept whole."""
    kept = [(layer.keys, layer.values) for layer in result.cache.layers]
    if all(keys.shape[2] < capacity for keys, _ in kept) or ids.shape[1] <= window:
        return result
    queries = window_queries(model, result, ids, window)
    family = family_for(model.config)
    for index, (layer, attn) in enumerate(zip(result.cache.layers, (lay.self_attn for lay in decoder_layers(model)))):
        keys, values = kept[index]
        if keys.shape[2] < capacity:
            layer.keys, layer.values = keys, values
            continue
        scores = window_scores(queries[index], keys, attn.scaling, kernel, pooling, family.attention_sinks(attn))
        top = scores.topk(capacity - window, -1).indices.sort(-1).values.to(keys.device)  # (KVH, capacity - w)
        layer.keys, layer.values = _kept(keys, top, window), _kept(values, top, window)
    result.ragged = True
    return result


def _kept(t: torch.Tensor, top: torch.Tensor, window: int) -> torch.Tensor:
    """Of a layer's keys or values (B, KVH, M, D): each head's `top` rows before the window, then the window."""
    rows = top[None, :, :, None].expand(t.shape[0], -1, -1, t.shape[-1])
    return torch.cat([t[:, :, : t.shape[2] - window].gather(2, rows), t[:, :, t.shape[2] - window:]], 2)
