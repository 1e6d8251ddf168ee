"""How much memory a fit's fp64 running sums take, and where they are kept (`--sums-device`).

The capture keeps, for every split S of one pass, C_xx (d x d) and the mean
x (d), and for each late layer l = S..L-1 C_xy[l] (d x d) and the mean of
y_l (d), all fp64 (`RidgeSums`). `sums_bytes` is that formula; a test checks
it against the tensors of a real capture, byte for byte.

`auto` keeps the sums on the model's GPU when they fit there beside the
capture's own working memory, else in CPU memory; the products are taken in
fp32 where the activations are either way, so only the fp64 accumulation
moves (`RidgeSums`).

Choosing lambda on held-out text (`--heldout`) scores the grid in passes
that fit a budget (`--heldout-memory`): each pass solves its lambdas' fp32
maps (`maps_bytes` each, on the CPU, where `RidgeSums.solve` puts them),
runs the held-out documents once, and frees them, keeping only the best
lambda's maps so far. `lambdas_per_pass` is the grouping rule,
`heldout_budget` the budget (auto: HELDOUT_SHARE of the available CPU memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

SUMS_DEVICES = ("auto", "cpu", "model")
FP64_BYTES = 8
FP32_BYTES = 4
# Share of the available CPU memory (after the capture, so beside the sums) that
# `--heldout-memory auto` gives the held-out lambda search's maps: the rest stays
# for the solve's fp64 working set and the held-out forward.
HELDOUT_SHARE = 0.5
MEMINFO = Path("/proc/meminfo")
# Share of the GPU's total memory `auto` leaves free beside the sums: the
# capture's activations (one document's forward, no cache) and the per-layer
# fp32 product (d x d) must still fit.
GPU_MARGIN = 0.15


def sums_bytes(d_in: int, n_layers: int, splits: Sequence[int], d_out: int | None = None) -> int:
    """Bytes of the fp64 sums of one capture pass over `splits`.

    Per split S: 8 * (d_in^2 + d_in) for C_xx and the mean of x, plus
    8 * (d_in * d_out + d_out) for each of the L - S late layers S..L-1
    (d_out = d_in for hidden states). To leading order 8 d^2 (1 + L - S).
    """
    d_out = d_in if d_out is None else d_out
    total = 0
    for split in splits:
        n_maps = n_layers - split
        total += FP64_BYTES * (d_in * d_in + d_in + n_maps * (d_in * d_out + d_out))
    return total


def maps_bytes(d_in: int, n_maps: int, d_out: int | None = None) -> int:
    """Bytes of one lambda's fp32 maps: A_l (d_out x d_in) and b_l (d_out) for n_maps late layers."""
    d_out = d_in if d_out is None else d_out
    return FP32_BYTES * n_maps * (d_out * d_in + d_out)


def lambdas_per_pass(budget_bytes: int, per_lambda_bytes: int, n_lambdas: int) -> int:
    """How many lambdas one held-out pass scores within `budget_bytes` of maps (at least 1).

    All n_lambdas when their maps fit the budget (one pass). Otherwise the
    best lambda's maps so far stay alive beside each pass's, so a pass takes
    budget // per_lambda_bytes - 1 lambdas, at least one (a budget under two
    lambdas' maps is exceeded: one lambda per pass is the least a pass can do).
    """
    if n_lambdas < 1 or per_lambda_bytes < 1:
        raise ValueError(f"need n_lambdas >= 1 and per_lambda_bytes >= 1; got {n_lambdas}, {per_lambda_bytes}")
    fit = max(0, budget_bytes) // per_lambda_bytes
    return n_lambdas if fit >= n_lambdas else max(1, fit - 1)


def maps_held(n_lambdas: int, group: int | None = None) -> int:
    """Lambdas' maps alive at once when passes score `group` lambdas each (None: all in one pass)."""
    group = n_lambdas if group is None else group
    return n_lambdas if group >= n_lambdas else group + 1


def fit_peak_bytes(d: int, n_layers: int, splits: Sequence[int], n_lambdas: int = 1, group: int | None = None) -> int:
    """Predicted peak of a fit's own memory (beside the model), sums on the CPU.

    The sums of every split (`sums_bytes`) stay alive through the solves; the
    solve of the split with the most late layers adds its Cholesky factor and
    one fp64 solution (8 d^2 each), one fp32 d x d working buffer (what
    benchmarks/fit_memory.py measures beyond the rest) and the fp32 maps
    (`maps_bytes`) of `maps_held(n_lambdas, group)` lambdas: with held-out
    passes of `group` lambdas (None: all n_lambdas in one pass), one pass's
    maps plus the best lambda's so far.
    """
    n_maps = n_layers - min(splits)
    work = FP64_BYTES * 2 * d * d + FP32_BYTES * d * d
    return sums_bytes(d, n_layers, splits) + work + maps_held(n_lambdas, group) * maps_bytes(d, n_maps)


def parse_heldout_memory(value: str | float) -> float | None:
    """`--heldout-memory`: a number of GiB > 0, or 'auto' (returned as None)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    try:
        gib_ = float(value)
    except (TypeError, ValueError):
        gib_ = math.nan
    if not (math.isfinite(gib_) and gib_ > 0):
        raise ValueError(f"held-out memory {value!r} is not valid: give a number of GiB > 0 or 'auto'")
    return gib_


def available_memory() -> tuple[int | None, str]:
    """Available CPU memory in bytes and where the number came from (None where neither source exists).

    psutil.virtual_memory().available when psutil is installed, else
    MemAvailable of /proc/meminfo (Linux).
    """
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available), "psutil available"
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, f"{MEMINFO} MemAvailable"
    except OSError:
        pass
    return None, f"no psutil, no MemAvailable in {MEMINFO}"


def heldout_budget(heldout_memory: str | float | None) -> tuple[int, str]:
    """Bytes the held-out passes' maps may take and a phrase saying why.

    A number: that many GiB. auto (or None): HELDOUT_SHARE of the available
    CPU memory (`available_memory`); where it cannot be read, 0, so each pass
    scores one lambda (the least memory).
    """
    gib_ = heldout_memory if heldout_memory is None else parse_heldout_memory(heldout_memory)
    if gib_ is not None:
        return int(gib_ * 2**30), f"budget {gib(gib_ * 2**30)} as asked"
    free, source = available_memory()
    if free is None:
        return 0, f"budget unknown ({source}): one lambda per pass"
    budget = int(HELDOUT_SHARE * free)
    return budget, f"budget {gib(budget)} = {HELDOUT_SHARE:.0%} of {gib(free)} available ({source})"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def choose_sums_device(choice: str, model_device: torch.device | str, need_bytes: int) -> tuple[torch.device, str]:
    """The device for the fp64 sums and a sentence saying why (`choice`: auto, cpu, model).

    auto: the model's device when it is a GPU with `need_bytes` free plus a
    margin of GPU_MARGIN of its total memory (torch.cuda.mem_get_info), else
    the CPU. A CPU model keeps them on the CPU.
    """
    if choice not in SUMS_DEVICES:
        raise ValueError(f"sums device {choice!r} is not one of {', '.join(SUMS_DEVICES)}")
    model_device = torch.device(model_device)
    if choice == "cpu":
        return torch.device("cpu"), f"{gib(need_bytes)} of fp64 sums on cpu (asked: cpu)"
    if choice == "model" or model_device.type != "cuda":
        return model_device, f"{gib(need_bytes)} of fp64 sums on the model's device {model_device} (asked: {choice})"
    free, total = torch.cuda.mem_get_info(model_device)
    margin = int(GPU_MARGIN * total)
    room = f"{gib(free)} free on {model_device}, {gib(margin)} kept as margin"
    if need_bytes + margin <= free:
        return model_device, f"{gib(need_bytes)} of fp64 sums on {model_device} ({room})"
    return torch.device("cpu"), f"{gib(need_bytes)} of fp64 sums on cpu: the GPU is short ({room})"
