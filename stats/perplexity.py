"""Perplexity gap exp(dNLL) - 1, averaged per domain then across domains (paper section 5.3).

dNLL is an arm's mean loss on a document minus the reference arm's, in nats
per token. The gap exp(dNLL) - 1 is the relative increase in perplexity. It is
computed per document, averaged within each domain, then averaged across
domains, so every domain weighs the same whatever its document count (with
equal counts this is the plain average over documents). The interval is the
paired percentile bootstrap of that statistic, resampling documents within
their domain (or within finer `strata`, e.g. domain x length, section 3.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from rf_eval.stats.bootstrap import resample_means, summarize_resamples

__all__ = ["PerplexityGap", "document_gaps", "perplexity_gap"]


@dataclass(frozen=True)
class PerplexityGap:
    """Domain-averaged perplexity gap (a fraction: 0.016 is +1.6%) and its interval."""

    gap: float
    low: float
    high: float
    per_domain: dict[str, float]
    n_documents: int
    confidence: float


def document_gaps(arm_nll: ArrayLike, ref_nll: ArrayLike) -> np.ndarray:
    """exp(arm NLL - reference NLL) - 1 per document (NLL in nats per token)."""
    a = np.asarray(arm_nll, dtype=np.float64).reshape(-1)
    r = np.asarray(ref_nll, dtype=np.float64).reshape(-1)
    if a.shape != r.shape:
        raise ValueError(f"paired losses must have the same length ({a.shape[0]} != {r.shape[0]})")
    return np.expm1(a - r)


def perplexity_gap(
    arm_nll: ArrayLike,
    ref_nll: ArrayLike,
    *,
    domains: ArrayLike | None = None,
    strata: ArrayLike | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PerplexityGap:
    """The perplexity gap of `arm` over `ref`, per document, domain-averaged, with an interval.

    Documents are resampled within `strata` (default: their domains); strata
    must lie within domains, so that each domain keeps its size in a resample.
    """
    gaps = document_gaps(arm_nll, ref_nll)
    n = gaps.shape[0]
    if n == 0:
        raise ValueError("no documents")
    labels = np.asarray(["all"] * n if domains is None else domains).astype(str)
    if labels.shape != (n,):
        raise ValueError(f"domains must give one label per document ({labels.shape} for {n})")
    names, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    per_domain = {str(d): float(gaps[inverse == i].mean()) for i, d in enumerate(names)}
    weights = 1.0 / (len(names) * counts[inverse])
    within = labels if strata is None else np.asarray(strata)
    means = resample_means(gaps, strata=within, weights=weights, n_resamples=n_resamples, seed=seed)
    point = float(np.mean(list(per_domain.values())))
    boot = summarize_resamples([point], means, confidence=confidence, n=n)[0]
    return PerplexityGap(point, boot.low, boot.high, per_domain, n, confidence)
