"""Layers 0..S-1 of one prompt, run once for the arms of one process that share a split.

Every arm of split S runs the stock model's layers 0..S-1 over the whole prompt (`lower.run_lower_layers`):
the same computation whatever the arm fills, selects or keeps. Inside `rf_eval.engine.shared_rows.shared_rows()`
(the arms of an `InProcessLauncher`: `rf-eval demo`), the first arm to run a prompt at a split keeps what
the pass leaves for the late layers (each lower layer's keys and values, x_S and the RoPE tables, copied to
the CPU) and the next arms read it back: bit for bit what they would compute, found only under the full
weights' sha256, the device, the thread count (`shared_rows.model_key`), the tokens, the split and the
chunk size. Outside such a block nothing is kept or read.

The pass's seconds, timed where it ran (the device synchronised), are charged to every arm that reads it
back (the result's `timings["reused"]`, which `rf_eval.method` adds to the prefill it times), so an arm's
measured prefill seconds stay what its own prefill costs.

Shared: caches whose lower layers are all full attention (`DynamicLayer`); a sliding-window or recurrent
lower layer keeps state this module does not copy, and such a prompt runs its own pass. A selector that
captures lower-layer inputs (`capture`) runs its own pass too, and keeps it for the arms after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rf_eval.engine.lower import run_lower_layers
from rf_eval.engine.plan import LayerInputs
from rf_eval.engine.shared_rows import active, find, hold, holds, model_key
from rf_eval.prefill_timer import Stopwatch


@dataclass(frozen=True)
class LowerPass:
    """What layers 0..S-1 of one prompt leave for the late layers, on the CPU, and the seconds they took."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    devices: tuple[torch.device, ...]  # each lower layer's (a model dispatched over devices has several)
    inputs: LayerInputs
    inputs_device: torch.device  # the split layer's
    seconds: float

    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, *_tensors(self.inputs)]
        return sum(t.numel() * t.element_size() for t in tensors)


def run_shared_lower_layers(model: nn.Module, input_ids: torch.Tensor, split: int, cache: DynamicCache,
                            chunk_size: int | None = None, capture: dict[int, slice] | None = None
                            ) -> tuple[LayerInputs, dict[int, torch.Tensor], float]:
    """`run_lower_layers`, read back when an earlier arm of the block ran it (see the module); returns its
    (inputs, captured lower-layer inputs) and the seconds the pass took where it ran (0 if run here)."""
    key = _key(model, input_ids, split, chunk_size, cache)
    if key is None:
        inputs, lower = run_lower_layers(model, input_ids, split, cache, chunk_size, capture)
        return inputs, lower, 0.0
    kept = None if capture else find(key)
    if kept is not None:
        return _restored(kept, cache), {}, kept.seconds
    with Stopwatch(input_ids.device) as clock:
        inputs, lower = run_lower_layers(model, input_ids, split, cache, chunk_size, capture)
    if holds(key):  # a capturing arm ran a pass already kept: no second copy
        return inputs, lower, 0.0
    layers = cache.layers[:split]
    cpu = LowerPass(tuple(_moved(layer.keys, "cpu") for layer in layers),
                    tuple(_moved(layer.values, "cpu") for layer in layers), tuple(layer.keys.device for layer in layers),
                    _moved_inputs(inputs, "cpu"), inputs.x_split.device, clock.seconds)
    hold(key, cpu, cpu.nbytes())
    return inputs, lower, 0.0


def _key(model: nn.Module, input_ids: torch.Tensor, split: int, chunk_size: int | None, cache: DynamicCache
         ) -> tuple | None:
    """The pass's key in the current block; None outside one, or where its state is not only keys and values."""
    if not active() or split < 1 or not all(type(layer) is DynamicLayer for layer in cache.layers[:split]):
        return None
    weights = model_key(model, input_ids.device)
    if weights is None:
        return None
    return ("lower layers", weights, split, chunk_size, tuple(map(tuple, input_ids.tolist())))


def _restored(kept: LowerPass, cache: DynamicCache) -> LayerInputs:
    for layer, keys, values, device in zip(cache.layers, kept.keys, kept.values, kept.devices):
        layer.update(keys.to(device), values.to(device))  # concatenated onto an empty layer: a copy
    return _moved_inputs(kept.inputs, kept.inputs_device)


def _moved(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A copy on `device`, never the same tensor: an arm may write into what it reads."""
    return tensor.detach().to(device, copy=True)


def _moved_inputs(inputs: LayerInputs, device: torch.device | str) -> LayerInputs:
    tables = inputs.tables and {kind: (_moved(c, device), _moved(s, device)) for kind, (c, s) in inputs.tables.items()}
    return LayerInputs(_moved(inputs.x_split, device), _moved(inputs.cos, device), _moved(inputs.sin, device), tables)


def _tensors(inputs: LayerInputs) -> list[torch.Tensor]:
    tables = [t for pair in (inputs.tables or {}).values() for t in pair]
    return [inputs.x_split, inputs.cos, inputs.sin, *tables]
