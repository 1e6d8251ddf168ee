"""Devices and dtypes by name, shared by both methods' loaders and the CLI."""

from __future__ import annotations

from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """A torch dtype from a name; `auto`/None picks bf16 on CUDA and fp32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str | None) -> str:
    """The device to use (default: cuda if available); ValueError for one this machine lacks, before a model loads."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device name (cpu, cuda, cuda:1, mps): {err}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available on this machine (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available on this machine")
    return str(device)


def check_model_source(name: str) -> None:
    """A local path that does not exist is a clear error; a hub id (`org/name` or `name`) is left to the loader."""
    text = str(name)
    looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
    from pathlib import Path

    if looks_local and not Path(text).expanduser().exists():
        raise ValueError(f"model {text!r}: no such local folder (a hub id looks like org/name)")
    if Path(text).expanduser().is_file():
        raise ValueError(f"model {text!r} is a file; give the model's folder (config.json, weights) or a hub id")


def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> None:
    """Join the torchrun process group (NCCL on CUDA, else gloo): what a fit under
    `torchrun --nproc_per_node K` does first; nothing in a single process."""
    import os

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


_GLOO: dict[tuple[int, ...], object] = {}


def all_reduce(t: torch.Tensor, op=None) -> None:
    """`torch.distributed.all_reduce` in place, for a tensor on any device.

    NCCL (the backend of GPU runs) reduces CUDA tensors only, while the fit's
    counts, held-out scores and (with `--sums-device cpu`) fp64 sums live on
    the CPU: those go through a gloo group of the same ranks, made once.
    """
    import torch.distributed as dist

    kwargs = {} if op is None else {"op": op}
    if t.device.type == "cpu" and dist.get_backend() != "gloo":
        ranks = tuple(range(dist.get_world_size()))
        if ranks not in _GLOO:
            _GLOO[ranks] = dist.new_group(list(ranks), backend="gloo")
        kwargs["group"] = _GLOO[ranks]
    dist.all_reduce(t, **kwargs)


def input_device(model: Any) -> torch.device:
    """Where a model's input ids go: its input embedding's device, or for a model placed by
    accelerate (device_map, CPU/disk offload) the embedding's execution device."""
    embedding = model.get_input_embeddings()
    hook = getattr(embedding, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    return torch.device(device) if device is not None else embedding.weight.device
