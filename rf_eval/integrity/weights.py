"""A cheap fingerprint of a model's weights (which weights maps were fitted on, what a cache holds).

`weights_fingerprint(model)` is the sha256 of every named parameter's name,
shape and dtype and of the bytes of an evenly strided sample of at most
`SAMPLE` of its elements (moved to the CPU; parameters on the `meta` device,
e.g. offloaded to disk by accelerate, contribute their name and shape only).
It costs well under a second on an 8B model. It tells apart two checkpoints of
one architecture (a fine-tune or a merged adapter changes nearly every
element) and weights changed in place; an edit that touches only elements
outside the sample is not detected.

`weights_sha256(model)` hashes every byte of the parameters and buffers instead, for what must be exact
(`rf_eval.engine.shared_rows`: rows read back only for the very same weights); None where a tensor's bytes are
not in memory (`meta`).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

#: elements sampled per parameter
SAMPLE = 4096


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's element bytes on the CPU (numpy has no bfloat16: the raw words, whatever the dtype)."""
    return tensor.detach().reshape(-1).to("cpu").contiguous().view(torch.uint8).numpy().tobytes()


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 (hex) of the model's parameters, sampled; see the module docstring."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda np_: np_[0]):
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}\n".encode())
            if param.device.type == "meta" or param.numel() == 0:
                continue
            flat = param.detach().reshape(-1)
            digest.update(_raw_bytes(flat[::max(1, flat.numel() // SAMPLE)][:SAMPLE]))
    return digest.hexdigest()


def weights_sha256(model: nn.Module) -> str | None:
    """sha256 (hex) of the model's class and every parameter's and buffer's name, dtype, shape and bytes;
    None if any of them is on the `meta` device."""
    tensors = [*sorted(model.named_parameters()), *sorted(model.named_buffers())]
    if any(t.device.type == "meta" for _, t in tensors):
        return None
    digest = hashlib.sha256(type(model).__qualname__.encode())
    with torch.no_grad():
        for name, tensor in tensors:
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
            digest.update(_raw_bytes(tensor) if tensor.numel() else b"")
    return digest.hexdigest()
