"""A cheap fingerprint of a model's weights (which weights maps were fitted on, what a cache holds).

`weights_fingerprint(model)` is the sha256 of every named parameter's name,
shape and dtype and of the bytes of an evenly strided sample of at most
`SAMPLE` of its elements (moved to the CPU; parameters on the `meta` device,
e.g. offloaded to disk by accelerate, contribute their name and shape only).
It costs well under a second on an 8B model. It tells apart two checkpoints of
one architecture (a fine-tune or a merged adapter changes nearly every
element) and weights changed in place; an edit that touches only elements
outside the sample is not detected.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

#: elements sampled per parameter
SAMPLE = 4096


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 (hex) of the model's parameters, sampled; see the module docstring."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda np_: np_[0]):
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}\n".encode())
            if param.device.type == "meta" or param.numel() == 0:
                continue
            flat = param.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLE)
            sample = flat[::step][:SAMPLE].to("cpu").contiguous()
            if sample.dtype == torch.bfloat16:  # numpy has no bfloat16: hash the raw 16-bit words
                sample = sample.view(torch.int16)
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()
