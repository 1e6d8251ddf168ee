"""Layers 0..S-1: the model's own forward over every prompt row, stopped at the split (paper section 2.1)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from rf_eval.engine.plan import LayerInputs
from rf_eval.families import family_for


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


def _forward_to_split(model: nn.Module, input_ids: torch.Tensor, cache: DynamicCache,
                      chunk_size: int | None) -> LayerInputs:
    """The stock forward of the prompt, `chunk_size` rows at a time, each stopped at the split layer's pre-hook
    (`_StopAtSplit`): the split layer's input rows and the rotary tables, joined over the chunks."""
    n = input_ids.shape[1]
    step = n if chunk_size is None else chunk_size
    states, cos, sin, tables = [], [], [], []
    family = family_for(model.config)
    for start in range(0, n, step):
        try:
            model.model(input_ids=input_ids[:, start : start + step], cache=cache, use_cache=True)
        except _StopAtSplit as stopped:
            states.append(stopped.hidden_states)
            c, s = stopped.kwargs["position_embeddings"]
            cos.append(c)
            sin.append(s)
            tables.append(family.rope_tables(model, stopped.hidden_states, stopped.kwargs.get("position_ids")))
        else:  # pragma: no cover - the hook always fires
            raise RuntimeError("the forward pass did not reach the split layer")
    by_kind = None
    if tables[0] is not None:
        by_kind = {kind: (torch.cat([t[kind][0] for t in tables], -2), torch.cat([t[kind][1] for t in tables], -2))
                   for kind in tables[0]}
    return LayerInputs(torch.cat(states, 1), torch.cat(cos, -2), torch.cat(sin, -2), by_kind)


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
    try:
        inputs = _forward_to_split(model, input_ids, cache, chunk_size)
    finally:
        for handle in handles:
            handle.remove()
    lower = {}
    for index, pieces in captured.items():
        rows = capture[index]
        lower[index] = torch.cat(pieces, 1)[:, rows]
    return inputs, lower
