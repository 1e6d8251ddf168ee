"""Fit RaReCache transfer maps from one streaming pass over calibration text.

Paper section 3.1, eq. 1, and appendix A. Per calibration document both
models prefill it; every source layer's de-rotated cache entries are
concatenated into one feature row per token (all source layers), and every
target layer's de-rotated entries are the outputs. `RidgeSums` (one per
side) keeps the centred sums of that joint problem, Chan-merged in fp64,
so memory does not grow with the calibration text; a second `RidgeSums`
per target layer and side (target entries as its inputs, no outputs) keeps
the target's centred Gram for the R² denominators. Everything after is
solves on sub-blocks of those sums:

- single-source R² per (target layer, side, source layer): the
  least-squares fit of the target entries on that one source layer's
  entries (section 3.1: "a single-source least-squares regression"; no
  lambda, a minimum-norm solve where the Gram is singular),
  R² = 1 - SSE / SST pooled over the d_t output dimensions (the fraction of
  the target entries' total variance explained);
- the K source layers with the highest R² (ties: lower layer), concatenated
  in ascending layer order: W = (X^T X + λI)^-1 X^T Y on the centred sums
  (λ added to the centred Gram as eq. 1 writes it, not rescaled),
  b = ȳ - x̄W;
- the basis: covariance of the calibration predictions,
  Σ_ŷ = W^T (X^T X) W / N (exactly the covariance of x_n W over the
  calibration rows, with no second pass), eigenvectors by decreasing
  eigenvalue, the first r = min(rank, d_t) kept.

Keys map from source keys and values from source values (the side of the
target entry chooses the side of the source entries; the paper's "cache
entries" of the same tensor type). Positions are subsampled at `stride`
(0, stride, 2*stride, ... of each document, appendix C.1).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rf_eval.devices import rank_and_world
from rf_eval.engine import num_layers
from rf_eval.integrity.hashing import sha256_of_files
from rf_eval.integrity.tokenizers import check_tokenizers
from rf_eval.integrity.weights import weights_fingerprint
from rf_eval.rarecache.features import cache_entries, check_attention_only, kv_shape, prefill_cache
from rf_eval.rarecache.maps import SIDES, SideMap, TransferMaps
from rf_eval.ridge.calibration import check_nonempty, tokenized
from rf_eval.ridge.maps import config_hash
from rf_eval.ridge.sums import RidgeSums
from rf_eval.version import __version__

log = logging.getLogger(__name__)


@dataclass
class TransferSums:
    """Streaming sums of one source -> target pair, both sides."""

    n_source: int
    d_source: int  # one source layer's entry width, n_kv^s * d_h^s
    n_target: int
    d_target: int
    device: torch.device | str = "cpu"

    def __post_init__(self):
        targets = list(range(self.n_target))
        self.joint = {s: RidgeSums(0, self.n_source * self.d_source, targets, self.device) for s in SIDES}
        self.target_gram = {
            (s, layer): RidgeSums(layer, self.d_target, [], self.device) for s in SIDES for layer in targets
        }

    @property
    def count(self) -> int:
        return self.joint["key"].count

    def add_document(self, source: dict[str, list[torch.Tensor]], target: dict[str, list[torch.Tensor]]) -> None:
        """One document's (already subsampled) entries: side -> per-layer (n, d) tensors."""
        for side in SIDES:
            self.joint[side].add_document(
                torch.cat(source[side], -1), {layer: y for layer, y in enumerate(target[side])}
            )
            for layer, y in enumerate(target[side]):
                self.target_gram[(side, layer)].add_document(y, {})

    def all_reduce(self) -> None:
        for sums in [*self.joint.values(), *self.target_gram.values()]:
            sums.all_reduce()


def _block(j: int, width: int) -> slice:
    return slice(j * width, (j + 1) * width)


def _ridge(cxx: torch.Tensor, cxy: torch.Tensor, lam: float) -> torch.Tensor:
    """(C_xx + λI)^-1 C_xy in fp64."""
    eye = torch.eye(cxx.shape[0], dtype=cxx.dtype, device=cxx.device)
    chol, info = torch.linalg.cholesky_ex(cxx + lam * eye)
    if int(info) == 0:
        return torch.cholesky_solve(cxy, chol)
    return torch.linalg.solve(cxx + lam * eye, cxy)


def _least_squares(cxx: torch.Tensor, cxy: torch.Tensor) -> torch.Tensor:
    """A minimum-norm solution of the normal equations C_xx W = C_xy (fp64, CPU): least squares, no penalty."""
    return torch.linalg.lstsq(cxx.cpu(), cxy.cpu(), driver="gelsd").solution


def _sse(cxx: torch.Tensor, cxy: torch.Tensor, sst: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Residual sum of squares of the centred prediction x W: tr(C_yy) - 2 tr(W^T C_xy) + tr(W^T C_xx W)."""
    return sst - 2 * (w * cxy).sum() + (w * (cxx @ w)).sum()


def single_source_r2(sums: TransferSums, side: str, layer: int) -> torch.Tensor:
    """R² of each source layer alone for target `layer` (n_source,), pooled over output dimensions.

    Section 3.1: each single-source fit is least squares (not the maps' ridge), so
    R² is the share of the target entries' variance that source layer explains.
    """
    joint = sums.joint[side]
    cxy_all = joint.cxy[layer].cpu()
    cxx_all = joint.cxx.cpu()
    sst = torch.trace(sums.target_gram[(side, layer)].cxx.cpu())
    out = torch.empty(sums.n_source, dtype=torch.float64)
    for j in range(sums.n_source):
        b = _block(j, sums.d_source)
        cxx, cxy = cxx_all[b, b], cxy_all[b]
        out[j] = 1 - _sse(cxx, cxy, sst, _least_squares(cxx, cxy)) / sst
    return out


def top_layers(r2: torch.Tensor, k: int) -> list[int]:
    """The k source layers with the highest R² (ties: the lower layer), in ascending layer order."""
    order = sorted(range(r2.numel()), key=lambda j: (-float(r2[j]), j))
    return sorted(order[:k])


def solve_side(sums: TransferSums, side: str, layer: int, chosen: list[int], lam: float, rank: int):
    """SideMap for one target layer and side from the chosen source layers; also its in-sample R²_K."""
    joint = sums.joint[side]
    index = torch.cat([torch.arange(j * sums.d_source, (j + 1) * sums.d_source) for j in chosen])
    cxx = joint.cxx.cpu()[index][:, index]
    cxy = joint.cxy[layer].cpu()[index]
    mean_x = joint.mean_x.cpu()[index]
    w = _ridge(cxx, cxy, lam)  # (d_s, d_t)
    bias = joint.mean_y[layer].cpu() - mean_x @ w
    cov = w.T @ cxx @ w / joint.count  # covariance of the calibration predictions (appendix A)
    evals, evecs = torch.linalg.eigh((cov + cov.T) / 2)
    order = torch.argsort(evals, descending=True)
    r = min(rank, w.shape[1])
    basis, top = evecs[:, order[:r]], evals[order[:r]]
    sst = torch.trace(sums.target_gram[(side, layer)].cxx.cpu())
    r2_k = float(1 - _sse(cxx, cxy, sst, w) / sst)
    return SideMap(chosen, w.float(), bias.float(), basis.float().contiguous(), top.float()), r2_k


def solve_transfer(sums: TransferSums, k: int, rank: int, lam: float) -> tuple[TransferMaps, dict]:
    """All maps from the sums: layer choice by R², ridge solve, basis. Returns (maps, R² report)."""
    if sums.count == 0:
        raise ValueError("no calibration rows were accumulated")
    if not 1 <= k <= sums.n_source:
        raise ValueError(f"k must be in 1..{sums.n_source} (the source's layer count), got {k}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    maps, report = {}, {s: {} for s in SIDES}
    for side in SIDES:
        for layer in range(sums.n_target):
            r2 = single_source_r2(sums, side, layer)
            chosen = top_layers(r2, k)
            maps[(side, layer)], r2_k = solve_side(sums, side, layer, chosen, lam, rank)
            report[side][str(layer)] = {"r2_k": round(r2_k, 6), "r2_single": [round(float(v), 6) for v in r2]}
    means = {
        (side, j): sums.joint[side].mean_x.cpu()[_block(j, sums.d_source)].float()
        for side in SIDES
        for j in range(sums.n_source)
    }
    return TransferMaps(maps=maps, source_mean=means), report


@torch.no_grad()
def accumulate(
    source: nn.Module, target: nn.Module, documents, stride: int, device=None
) -> TransferSums:
    """Stream tokenized documents (1 x n tensors) through both models into TransferSums."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    fam_s, fam_t = check_attention_only(source, "source"), check_attention_only(target, "target")
    kv_s, hd_s = kv_shape(source.config)
    kv_t, hd_t = kv_shape(target.config)
    sums = TransferSums(num_layers(source), kv_s * hd_s, num_layers(target), kv_t * hd_t,
                        device or next(target.parameters()).device)
    t_device = next(target.parameters()).device
    for ids in documents:
        picked = torch.arange(0, ids.shape[1], stride)
        src = cache_entries(source, fam_s, prefill_cache(source, ids.to(next(source.parameters()).device)))
        tgt = cache_entries(target, fam_t, prefill_cache(target, ids.to(t_device)))
        sums.add_document(
            {s: [x[picked.to(x.device)] for x in src[i]] for i, s in enumerate(SIDES)},
            {s: [y[picked.to(y.device)] for y in tgt[i]] for i, s in enumerate(SIDES)},
        )
    sums.all_reduce()
    return sums


@dataclass(frozen=True)
class TransferSettings:
    """A transfer fit's numbers (section 3.1, appendix A) and how it runs: `k` source layers per target
    layer, the basis rank `rank`, eq. 1's penalty `lam`, every `stride`-th position of documents cut at
    `max_tokens`; `sums_device`: where the fp64 sums live (default: the target's device; "cpu" keeps them
    off the GPU)."""

    k: int = 8
    rank: int = 128
    lam: float = 0.01
    stride: int = 1
    max_tokens: int = 32768
    progress: bool = False
    sums_device: torch.device | str | None = None


def fit_transfer(
    source: nn.Module,
    target: nn.Module,
    source_tokenizer,
    target_tokenizer,
    calibration: Sequence[str | Path],
    *,
    out: str | Path | None = None,
    settings: TransferSettings | None = None,
    **options: Any,
) -> tuple[TransferMaps, Path | None]:
    """Fit and (on rank 0, when `out` is given) save the maps of one source -> target pair.

    `settings`: the fit's numbers and where its sums live (`TransferSettings`); `options`: any of its fields
    by name, over `settings` (`fit_transfer(..., k=8, rank=128, lam=0.01)`).
    """
    s = replace(settings or TransferSettings(), **options)
    vocab_hash = check_tokenizers(source_tokenizer, target_tokenizer)
    check_nonempty(calibration)
    if not s.lam > 0:
        raise ValueError(f"lambda must be > 0, got {s.lam}")
    if not 1 <= s.k <= num_layers(source):
        raise ValueError(f"k must be in 1..{num_layers(source)} (the source's layer count), got {s.k}")
    t0 = time.perf_counter()
    docs = tokenized(target_tokenizer, calibration, "cpu", s.max_tokens, "calibration", s.progress)
    sums = accumulate(source, target, docs, s.stride, s.sums_device)
    maps, report = solve_transfer(sums, s.k, s.rank, s.lam)
    maps.metadata = {
        "source_config_hash": config_hash(source.config),
        "target_config_hash": config_hash(target.config),
        "source_weights_sha256": weights_fingerprint(source),
        "target_weights_sha256": weights_fingerprint(target),
        "source_model": getattr(source.config, "_name_or_path", ""),
        "target_model": getattr(target.config, "_name_or_path", ""),
        "tokenizer_sha256": vocab_hash,
        "k": str(s.k),
        "rank": str(s.rank),
        "lambda": repr(s.lam),
        "stride": str(s.stride),
        "max_tokens": str(s.max_tokens),
        "rows": str(sums.count),
        "calibration_sha256": sha256_of_files(calibration),
        "calibration_files": json.dumps([Path(p).name for p in calibration]),
        "r2": json.dumps(report),
        "rf_eval_version": __version__,
        "fit_seconds": f"{time.perf_counter() - t0:.1f}",
    }
    path = None
    if out is not None and rank_and_world()[0] == 0:
        path = maps.save(out)
    return maps, path
