"""How much memory a fit's fp64 running sums take, and where they are kept (`--sums-device`).

The capture keeps, for every split S of one pass, C_xx (d x d) and the mean
x (d), and for each late layer l = S..L-1 C_xy[l] (d x d) and the mean of
y_l (d), all fp64 (`RidgeSums`). `sums_bytes` is that formula; a test checks
it against the tensors of a real capture, byte for byte.

`auto` keeps the sums on the model's GPU when they fit there beside the
capture's own working memory, else in CPU memory; the products are taken in
fp32 where the activations are either way, so only the fp64 accumulation
moves (`RidgeSums`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

SUMS_DEVICES = ("auto", "cpu", "model")
FP64_BYTES = 8
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


def fit_peak_bytes(d: int, n_layers: int, splits: Sequence[int], n_lambdas: int = 1) -> int:
    """Predicted peak of a fit's own memory (beside the model), sums on the CPU.

    The sums of every split (`sums_bytes`) stay alive through the solves; the
    solve of the split with the most late layers adds its Cholesky factor and
    one fp64 solution (8 d^2 each) and its fp32 maps, 4 d^2 per late layer
    per lambda tried (all lambdas of the grid are scored in one held-out pass),
    plus one fp32 d x d working buffer (what benchmarks/fit_memory.py measures beyond the rest).
    """
    n_maps = n_layers - min(splits)
    return sums_bytes(d, n_layers, splits) + FP64_BYTES * 2 * d * d + 4 * d * d * (1 + n_maps * n_lambdas)


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
