"""Streaming ridge regression for RidgeFill maps (paper section 2.2).

For one split S the fit keeps, over all calibration rows, the centred sums
C_xx = X^T X and C_xy[l] = X^T Y_l (X, Y_l with their means removed) plus the
means and the row count. Documents arrive one at a time: each document's
products are taken in fp32 on its own centred rows and merged into fp64
running sums with the pairwise-update formula (Chan et al.), so memory does
not grow with the calibration text and the result equals a solve on all rows
stacked. The sums are additive across processes (`all_reduce`), and are
saved so that a new lambda needs only new solves.

Solve: A_l = C_yx (C_xx + alpha I)^-1, b_l = mu_l - A_l mu_S,
alpha = lambda * tr(C_xx) / d_in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from rf_eval.devices import all_reduce
from rf_eval.files.tensor_files import read_tensors, save_tensors

# The paper's grid: nine values between 1e-4 and 1 (appendix G).
LAMBDA_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


@dataclass
class RidgeSums:
    """Running centred sums for one split S and its late layers."""

    split: int
    d_in: int
    layers: list[int]
    device: torch.device | str = "cpu"
    count: int = 0
    mean_x: torch.Tensor = field(init=False)
    cxx: torch.Tensor = field(init=False)
    mean_y: dict[int, torch.Tensor] = field(init=False)
    cxy: dict[int, torch.Tensor] = field(init=False)
    # per-document scratch: the document's split states (fp32) and their mean
    _doc_x: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        f64 = dict(dtype=torch.float64, device=self.device)
        self.mean_x = torch.zeros(self.d_in, **f64)
        self.cxx = torch.zeros(self.d_in, self.d_in, **f64)
        self.mean_y, self.cxy = {}, {}

    # -- accumulation ---------------------------------------------------------------
    # Products are taken in fp32 on the device the activations arrive on; only
    # their fp64 accumulation happens on `self.device` (the sums' device, which
    # may be the CPU beside a GPU model). Both steps go in row blocks of about
    # _BLOCK elements, so no fp64 copy of a document's n x d states or of a
    # whole d x d product is made.
    def start_document(self, x_split: torch.Tensor) -> None:
        """Begin a document with its split states (n x d_in, any float dtype)."""
        self._doc_x = x_split.reshape(-1, self.d_in).to(torch.float32)

    def add_layer(self, layer: int, y: torch.Tensor) -> None:
        """Merge the current document's rows for late layer `layer` (n x d_out)."""
        x = self._doc_x
        y = y.reshape(x.shape[0], -1).to(device=x.device, dtype=torch.float32)
        n_a, n_b = self.count, x.shape[0]
        mx_b, my_b = _mean64(x), _mean64(y)
        prod = (x - mx_b.float()).T @ (y - my_b.float())  # fp32 product, fp64 sum
        if layer not in self.cxy:
            self.cxy[layer] = torch.zeros(self.d_in, y.shape[1], dtype=torch.float64, device=self.device)
            self.mean_y[layer] = torch.zeros(y.shape[1], dtype=torch.float64, device=self.device)
        n = n_a + n_b
        dx = mx_b.to(self.device) - self.mean_x
        dy = my_b.to(self.device) - self.mean_y[layer]
        _add64(self.cxy[layer], prod)
        del prod
        self.cxy[layer].addr_(dx, dy, alpha=n_a * n_b / n)
        self.mean_y[layer] += dy * (n_b / n)

    def finish_document(self) -> None:
        """Merge the current document's X^T X and advance the row count."""
        x = self._doc_x
        n_a, n_b = self.count, x.shape[0]
        mx_b = _mean64(x)
        xc = x - mx_b.float()
        n = n_a + n_b
        dx = mx_b.to(self.device) - self.mean_x
        _add64(self.cxx, xc.T @ xc)
        self.cxx.addr_(dx, dx, alpha=n_a * n_b / n)
        self.mean_x += dx * (n_b / n)
        self.count = n
        self._doc_x = None

    def add_document(self, x_split: torch.Tensor, ys: dict[int, torch.Tensor]) -> None:
        """One document at once: split states and each late layer's inputs."""
        self.start_document(x_split)
        for layer, y in ys.items():
            self.add_layer(layer, y)
        self.finish_document()

    # -- combining ----------------------------------------------------------------
    def all_reduce(self) -> None:
        """Sum these statistics over all torch.distributed processes (documents sharded by rank)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        # Raw (uncentred) fp64 sums are additive; convert, reduce, and centre again.
        count = torch.tensor([float(self.count)], dtype=torch.float64, device=self.device)
        all_reduce(count)
        sx = self.mean_x * self.count
        sxx = self.cxx + self.count * torch.outer(self.mean_x, self.mean_x)
        for t in (sx, sxx):
            all_reduce(t)
        total = int(count.item())
        new_mean_x = sx / total
        for layer in self.layers:
            sy = self.mean_y[layer] * self.count
            sxy = self.cxy[layer] + self.count * torch.outer(self.mean_x, self.mean_y[layer])
            all_reduce(sy)
            all_reduce(sxy)
            self.mean_y[layer] = sy / total
            self.cxy[layer] = sxy - total * torch.outer(new_mean_x, self.mean_y[layer])
        self.cxx = sxx - total * torch.outer(new_mean_x, new_mean_x)
        self.mean_x = new_mean_x
        self.count = total

    # -- solving -----------------------------------------------------------------
    def solve(self, lam: float) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """A_l (d_out x d_in, fp32) and b_l (d_out, fp32) for every late layer, in fp64 on the CPU."""
        if not lam > 0:
            raise ValueError(f"lambda must be > 0, got {lam}")
        if self.count == 0:
            raise ValueError("no calibration rows were accumulated")
        cxx = self.cxx.cpu()
        alpha = lam * torch.trace(cxx) / self.d_in
        ridged = cxx.clone()
        ridged.diagonal().add_(alpha)
        chol = torch.linalg.cholesky(ridged)
        del ridged
        mean_x = self.mean_x.cpu()
        A, b = {}, {}
        for layer in self.layers:
            a_t = torch.cholesky_solve(self.cxy[layer].cpu(), chol)  # (d_in x d_out) = (Cxx+aI)^-1 Cxy
            b[layer] = (self.mean_y[layer].cpu() - a_t.T @ mean_x).float()
            A[layer] = a_t.T.to(torch.float32, memory_format=torch.contiguous_format)
            del a_t
        return A, b

    # -- persistence ---------------------------------------------------------------
    def save(self, path: str | Path, metadata: dict[str, str]) -> Path:
        tensors = {"mean_x": self.mean_x.cpu(), "cxx": self.cxx.cpu()}
        for layer in self.layers:
            tensors[f"mean_y.{layer}"] = self.mean_y[layer].cpu()
            tensors[f"cxy.{layer}"] = self.cxy[layer].cpu()
        meta = dict(metadata)
        meta.update(split=str(self.split), count=str(self.count), layers=json.dumps(self.layers))
        return save_tensors(tensors, path, meta)

    @classmethod
    def load(cls, path: str | Path) -> tuple[RidgeSums, dict[str, str]]:
        tensors, meta = read_tensors(path, ValueError, "sums file")
        layers = json.loads(meta["layers"])
        sums = cls(split=int(meta["split"]), d_in=tensors["mean_x"].shape[0], layers=layers)
        sums.mean_x, sums.cxx = tensors["mean_x"], tensors["cxx"]
        for layer in layers:
            sums.mean_y[layer] = tensors[f"mean_y.{layer}"]
            sums.cxy[layer] = tensors[f"cxy.{layer}"]
        sums.count = int(meta["count"])
        return sums, meta


_BLOCK = 1 << 24  # elements per block of the fp64 steps (128 MiB in fp64)


def _rows_per_block(t: torch.Tensor) -> int:
    return max(1, _BLOCK // max(1, t.shape[1]))


def _mean64(t: torch.Tensor) -> torch.Tensor:
    """Column means of an n x m fp32 tensor, summed in fp64 a row block at a time."""
    step = _rows_per_block(t)
    total = torch.zeros(t.shape[1], dtype=torch.float64, device=t.device)
    for i in range(0, t.shape[0], step):
        total += t[i:i + step].sum(0, dtype=torch.float64)
    return total / t.shape[0]


def _add64(acc: torch.Tensor, prod: torch.Tensor) -> None:
    """acc += prod: an fp32 product (any device) into fp64 sums on theirs, a row block at a time."""
    step = _rows_per_block(prod)
    for i in range(0, prod.shape[0], step):
        acc[i:i + step] += prod[i:i + step].to(device=acc.device, dtype=torch.float64)


def sums_filename(split: int) -> str:
    return f"sums_split{split}.safetensors"
