"""Paired percentile bootstrap, stratified, vectorized (RidgeFill paper section 3.4).

Every comparison in the paper is paired per sample or per document, with a 95%
percentile interval from 10,000 resamples; resampling happens within each task
or domain so that every resample keeps the same mix of tasks. Each item weighs
the same, so the statistic is the mean of the per-item differences.

How it is computed: one index matrix (resample x item) is drawn per comparison
and shared by the arm and its reference (that is what makes it paired); several
arms compared with one reference on the same items may share it too
(`paired_bootstraps`). For one or a few columns the resampled sums are gathered
through the index matrix; for many, each batch of index rows becomes a count
matrix and the resampled sums of all columns are one matrix product,
counts @ (weights * differences). Batches are capped in bytes (small enough to
stay in cache), so memory stays flat at any size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["PairedBootstrap", "paired_bootstrap", "paired_bootstraps", "resample_means"]

#: Memory cap of one batch (its index and count matrices), in bytes; small enough to stay in cache.
MAX_BATCH_BYTES = 2**20
#: Multiply-adds of one batch's matrix product. Threaded BLAS on products this small costs more
#: than it saves, badly so on a machine whose cores are busy; below this size it stays on one thread.
MAX_PRODUCT_SIZE = 2**20
#: Up to this many columns share the index matrix by gathering; beyond it, a count matrix and BLAS.
GATHER_MAX_COLUMNS = 3


@dataclass(frozen=True)
class PairedBootstrap:
    """A paired comparison: mean difference (arm - ref) and its percentile bounds.

    `low`/`high` bound the two-sided interval at `confidence`; `lower`/`upper`
    are the one-sided bounds at the same level (for 95%: the 5th and the 95th
    percentile of the resampled differences).
    """

    difference: float
    low: float
    high: float
    lower: float
    upper: float
    confidence: float
    n: int
    n_resamples: int

    @property
    def excludes_zero(self) -> bool:
        """True when the two-sided interval lies entirely on one side of zero."""
        return self.low > 0 or self.high < 0


def _as_matrix(columns: Sequence[ArrayLike], n: int | None = None) -> np.ndarray:
    cols = [np.asarray(c, dtype=np.float64).reshape(-1) for c in columns]
    size = cols[0].shape[0] if n is None else n
    for c in cols:
        if c.shape[0] != size:
            raise ValueError(f"paired scores must have the same length ({c.shape[0]} != {size})")
    matrix = np.stack(cols, axis=1)
    if not np.all(np.isfinite(matrix)):
        raise ValueError("scores contain NaN or infinite values; drop or fix those items first")
    return matrix


def _strata_groups(strata: ArrayLike | None, n: int) -> list[np.ndarray]:
    """Item positions of each stratum, in order of first appearance (one group if None)."""
    if strata is None:
        return [np.arange(n)]
    labels = np.asarray(strata)
    if labels.shape != (n,):
        raise ValueError(f"strata must give one label per item ({labels.shape} for {n} items)")
    _, first, codes = np.unique(labels, return_index=True, return_inverse=True)
    codes = codes.reshape(-1)
    return [np.flatnonzero(codes == code) for code in np.argsort(first)]


def _by_stratum(
    vals: np.ndarray, strata: ArrayLike | None, weights: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray]:
    """The weighted values (items x k) sorted by stratum, and each stratum's [lo, hi) positions in them."""
    n = vals.shape[0]
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError("weights must be one non-negative number per item, not all zero")
    groups = _strata_groups(strata, n)
    # Items sorted by stratum: stratum s then holds the positions [lo, hi), and a
    # resample draws its indices straight from that range.
    order = np.concatenate(groups)
    # equal weights: sum the raw values and divide once (exact sums for 0/100 scores)
    weighted = (vals if weights is None else vals * (w / w.sum() * n)[:, None])[order]
    return weighted, np.cumsum([0] + [g.shape[0] for g in groups])


def _batch_rows(n: int, k: int, n_resamples: int, max_batch_bytes: int) -> int:
    """Resamples per batch: its matrices within `max_batch_bytes`, at least one, at most `n_resamples`."""
    if k <= GATHER_MAX_COLUMNS:
        rows = max_batch_bytes // (8 * n)  # the int64 index matrix
    else:  # index + count matrices, and a product small enough that BLAS stays on one thread
        rows = min(max_batch_bytes // (24 * n), MAX_PRODUCT_SIZE // (n * k))
    return max(1, min(n_resamples, rows))


def _batch_sums(
    rng: np.random.Generator, weighted: np.ndarray, columns: np.ndarray, bounds: np.ndarray, b: int
) -> np.ndarray:
    """The resampled sums (b x k) of one batch of `b` resamples, drawn within each stratum (`columns`: the
    columns of `weighted`, each contiguous)."""
    n, k = weighted.shape
    if k <= GATHER_MAX_COLUMNS:  # few columns: gather and sum, stratum by stratum
        sums = np.zeros((b, k))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            index = rng.integers(0, hi - lo, size=(b, hi - lo))
            for j, column in enumerate(columns):
                sums[:, j] += column[lo:hi][index].sum(axis=1)
        return sums
    # many columns: a count matrix, then one matrix product for all of them
    index = np.empty((b, n), dtype=np.int64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index[:, lo:hi] = rng.integers(lo, hi, size=(b, hi - lo))
    index += (np.arange(b, dtype=np.int64) * n)[:, None]
    counts = np.bincount(index.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
    return counts @ weighted


def resample_means(
    values: ArrayLike,
    *,
    strata: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> np.ndarray:
    """Weighted means of `values` (items x k) over stratified bootstrap resamples.

    Returns an array (n_resamples x k). One index matrix is drawn and shared by
    all k columns. Within each stratum, items are drawn with replacement, as
    many as the stratum holds. `weights` (per item, default equal) are
    normalized to sum to one; since stratum sizes are fixed in every resample,
    weights of 1/(K * n_s) give the mean of K stratum means.
    """
    vals = np.asarray(values, dtype=np.float64)
    if vals.ndim == 1:
        vals = vals[:, None]
    n, k = vals.shape[0], vals.shape[1]
    if n == 0:
        raise ValueError("no items to resample")
    if n_resamples < 1:
        raise ValueError("n_resamples must be at least 1")
    weighted, bounds = _by_stratum(vals, strata, weights)
    rng = np.random.default_rng(seed)
    rows = _batch_rows(n, k, n_resamples, max_batch_bytes)
    out = np.empty((n_resamples, k))
    columns = np.ascontiguousarray(weighted.T)
    for start in range(0, n_resamples, rows):
        b = min(rows, n_resamples - start)
        out[start : start + b] = _batch_sums(rng, weighted, columns, bounds, b)
    return out / n


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def summarize_resamples(
    point: ArrayLike, means: np.ndarray, *, confidence: float, n: int
) -> list[PairedBootstrap]:
    """Percentile bounds of resampled statistics (n_resamples x k) around `point` (k)."""
    _check_confidence(confidence)
    point = np.atleast_1d(np.asarray(point, dtype=np.float64))
    means = means.reshape(means.shape[0], -1)
    alpha = 1.0 - confidence
    q = np.quantile(means, [alpha / 2, 1 - alpha / 2, alpha, confidence], axis=0)
    return [
        PairedBootstrap(
            difference=float(point[j]),
            low=float(q[0, j]),
            high=float(q[1, j]),
            lower=float(q[2, j]),
            upper=float(q[3, j]),
            confidence=confidence,
            n=n,
            n_resamples=means.shape[0],
        )
        for j in range(point.shape[0])
    ]


def paired_bootstrap(
    arm: ArrayLike,
    ref: ArrayLike,
    *,
    strata: ArrayLike | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired percentile bootstrap of mean(arm - ref), resampling within `strata`.

    `arm` and `ref` hold one score per item, aligned (item i of each is the same
    sample or document). Paper section 3.4: each item weighs the same, strata
    (task or domain) keep their sizes in every resample, 10,000 resamples, 95%.
    """
    return paired_bootstraps(
        {"arm": arm}, ref, strata=strata, n_resamples=n_resamples, confidence=confidence, seed=seed
    )["arm"]


def paired_bootstraps(
    arms: Mapping[str, ArrayLike],
    ref: ArrayLike,
    *,
    strata: ArrayLike | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, PairedBootstrap]:
    """`paired_bootstrap` of several arms against one reference on the same items.

    All arms share one index matrix, so their intervals come from the same
    resamples (and the work is one matrix product for all of them).
    """
    _check_confidence(confidence)
    names = list(arms)
    if not names:
        return {}
    ref_v = _as_matrix([ref])[:, 0]
    diffs = _as_matrix([arms[name] for name in names], n=ref_v.shape[0]) - ref_v[:, None]
    means = resample_means(diffs, strata=strata, n_resamples=n_resamples, seed=seed)
    results = summarize_resamples(diffs.mean(axis=0), means, confidence=confidence, n=diffs.shape[0])
    return dict(zip(names, results))
