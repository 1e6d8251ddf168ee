"""The capture pass: the unmodified model over calibration text, feeding ridge sums.

One forward pass per document serves every split chosen before it runs
(paper section 2.2): forward pre-hooks on the late layers see x_l, the
hidden state entering layer l (what `output_hidden_states` reports as
`hidden_states[l]`), and hand it to each split's sums at once, so no
document's states outlive its own pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from rf_eval.engine import decoder_layers
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT
from rf_eval.families import Family, family_for
from rf_eval.ridge.sums import RidgeSums
from rf_eval.ridge.targets import check_target, kv_rows, target_rows

Hook = Callable[[int, torch.Tensor, dict], None]


def _layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


class _LastInputSeen(Exception):
    """Raised by the last layer's hook: what the last layer and the final norm compute is never read."""


@torch.no_grad()
def run_with_layer_hooks(model: nn.Module, input_ids: torch.Tensor, first_layer: int, hook: Hook) -> None:
    """One plain forward (no cache) calling hook(l, x_l, layer_kwargs) for l >= first_layer; it stops once the
    last layer's input is seen, so neither the last layer, the final norm nor the lm_head runs (one layer
    in L saved: the inputs x_l never depend on it)."""
    layers = decoder_layers(model)
    handles = []
    for index, layer in enumerate(layers):
        if index < first_layer:
            continue

        def pre(_module, args, kwargs, index=index):
            hook(index, _layer_input(args, kwargs), kwargs)
            if index == len(layers) - 1:
                raise _LastInputSeen

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        model.model(input_ids=input_ids, use_cache=False)
    except _LastInputSeen:
        pass
    finally:
        for handle in handles:
            handle.remove()


def capture_sums(
    model: nn.Module,
    documents: Iterable[torch.Tensor],
    splits: Sequence[int],
    device: torch.device | str | None = None,
    target: str = "inputs",
) -> dict[int, RidgeSums]:
    """Ridge sums for every split from one pass per document (each a 1 x n LongTensor).

    `device`: where the fp64 sums live (default: the model's); the fp32
    products are taken where the activations are (`RidgeSums`). `target`: what
    each late layer's rows are regressed on (`rf_eval.ridge.targets`).
    """
    check_target(target)
    layers = decoder_layers(model)
    family = family_for(model.config)
    d = model.config.hidden_size
    device = device or next(model.parameters()).device
    sums = {s: RidgeSums(split=s, d_in=d, layers=list(range(s, len(layers))), device=device) for s in splits}

    def hook(index: int, x: torch.Tensor, _kwargs: dict) -> None:
        y = target_rows(family, layers[index], x, target)
        for split, acc in sums.items():
            if index == split:
                acc.start_document(x[0])
            if index >= split:
                acc.add_layer(index, y)

    for input_ids in documents:
        run_with_layer_hooks(model, input_ids, min(splits), hook)
        for acc in sums.values():
            acc.finish_document()
    return sums


def cache_writes(family: Family, layer: nn.Module, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """What a late layer writes for each row from input x (1, n, d), flattened per row.

    Attention: the keys (after k-norm and RoPE) and values it caches.
    Gated DeltaNet: the projections that drive its state update (q, k, v, beta, gate inputs).
    """
    return normed_writes(family, layer, family.input_norm(layer, x), kwargs)


def normed_writes(family: Family, layer: nn.Module, h: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """`cache_writes` from the layer's normed input h (1, n, d)."""
    if family.is_recurrent(layer):
        return torch.cat(family.delta_inputs(layer.linear_attn, h), -1)[0]
    cos, sin = kwargs["position_embeddings"]
    k, v = family.kv(layer.self_attn, h, cos, sin)
    n = h.shape[1]
    return torch.cat([k.transpose(1, 2).reshape(n, -1), v.transpose(1, 2).reshape(n, -1)], -1)


@torch.no_grad()
def heldout_cosines(
    model: nn.Module,
    documents: Iterable[torch.Tensor],
    split: int,
    candidates: dict[float, tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]],
    map_split: bool = DEFAULT_MAP_SPLIT,
    target: str = "inputs",
) -> dict[float, tuple[float, int]]:
    """Per lambda: (sum of row cosines, row count) between cache writes from predicted and true inputs.

    Paper section 2.2 (lambda chosen by this cosine on held-out text). With
    `map_split` layer S's filled rows read A_S x_S + b_S, so layer S is scored
    like every other late layer; without it (the default) the engine feeds
    layer S the true split state, every lambda would score 1 there, and it is
    skipped. With `target` kv the maps predict the keys (before RoPE) and values
    themselves, compared with the layer's own; a Gated DeltaNet layer's map
    predicts its normed input, scored by the state-update projections it drives.
    """
    check_target(target)
    family = family_for(model.config)
    layers = decoder_layers(model)
    totals = {lam: [0.0, 0] for lam in candidates}
    state: dict[str, torch.Tensor] = {}

    def hook(index: int, x: torch.Tensor, kwargs: dict) -> None:
        if index == split:
            state["x"] = x
            if not map_split:
                return
        layer = layers[index]
        kv = target == "kv" and not family.is_recurrent(layer)  # the map gives the writes themselves
        true_writes = (kv_rows(family, layer, x) if kv else cache_writes(family, layer, x, kwargs)).float()
        for lam, (A, b) in candidates.items():
            a = A[index].to(device=x.device, dtype=x.dtype)
            pred = state["x"] @ a.T + b[index].to(device=x.device, dtype=x.dtype)
            if kv:
                writes = pred[0].float()
            elif target == "kv":  # a Gated DeltaNet layer's normed input
                writes = normed_writes(family, layer, pred, kwargs).float()
            else:
                writes = cache_writes(family, layer, pred, kwargs).float()
            cos = torch.nn.functional.cosine_similarity(writes, true_writes, dim=-1)
            totals[lam][0] += float(cos.double().sum())
            totals[lam][1] += cos.numel()

    for input_ids in documents:
        run_with_layer_hooks(model, input_ids, split, hook)
    return {lam: (s, n) for lam, (s, n) in totals.items()}
