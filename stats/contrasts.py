"""One paired contrast as plain data: what a report row shows (paper sections 3.4, 4.5-4.7, 5.3).

Accuracy-like scores (points): the mean difference with its percentile
interval, the non-inferiority bound against the margin with the binomial
floor, and the exact McNemar test (or the sign test for non-binary scores) on
discordant items. Losses and other raw measures: the mean difference beside the
median with the heavy-tail flag, its interval, and for per-token losses (NLL)
the perplexity gap exp(dNLL) - 1, domain-averaged. A value an arm measured
against its own exact pass (KL): its mean with an interval, beside its median.
Every interval resamples within the strata of `rf_eval.stats.strata`, and each
result names them (`strata`). Numbers are left unrounded: rounding is the
renderer's job, after every difference is computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from rf_eval.stats.bootstrap import paired_bootstrap, resample_means, summarize_resamples
from rf_eval.stats.discordance import mcnemar_exact, sign_test
from rf_eval.stats.margin import decide_noninferiority
from rf_eval.stats.perplexity import perplexity_gap
from rf_eval.stats.strata import strata_of
from rf_eval.stats.tails import location

__all__ = ["is_loss_metric", "loss_contrast", "own_measure", "points_contrast"]


def is_loss_metric(metric: str, higher_is_better: bool) -> bool:
    """A per-token loss in nats (NLL-like), for which the perplexity gap is defined."""
    name = metric.lower()
    return not higher_is_better and ("nll" in name or "loss" in name)


def _binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0) | (x == 100)))


def _paired(pairs: pd.DataFrame, *, confidence: float, n_resamples: int, seed: int):
    """The arm's and reference's scores, their strata, the stratified paired bootstrap of them and the
    fields every paired contrast reports (means, difference, interval, strata)."""
    arm, ref = pairs["arm"].to_numpy(float), pairs["ref"].to_numpy(float)
    strata = strata_of(pairs)
    boot = paired_bootstrap(
        arm, ref, strata=strata.labels, n_resamples=n_resamples, confidence=confidence, seed=seed
    )
    row = {
        "n": boot.n, "arm_score": float(arm.mean()), "ref_score": float(ref.mean()),
        "difference": boot.difference, "low": boot.low, "high": boot.high, "strata": strata.text,
    }
    return arm, ref, strata, boot, row


def points_contrast(pairs: pd.DataFrame, *, margin: float, confidence: float, n_resamples: int,
                    seed: int) -> dict[str, Any]:
    """Paired contrast of scores in points (columns `arm`, `ref` of `pairs`), within its strata."""
    arm, ref, _, boot, row = _paired(pairs, confidence=confidence, n_resamples=n_resamples, seed=seed)
    ni = decide_noninferiority(boot.difference, boot.lower, boot.n, margin=margin, alpha=1 - confidence)
    if _binary(arm) and _binary(ref):
        mc = mcnemar_exact(arm, ref)
        test = {"name": "McNemar", "wins": mc.arm_only, "losses": mc.ref_only, "p": mc.p_value}
    else:
        st = sign_test(arm, ref)
        test = {"name": "sign", "wins": st.wins, "losses": st.losses, "p": st.p_value}
    return {
        **row, "lower": boot.lower, "floor": ni.floor, "bound": ni.bound, "binding": ni.binding,
        "passed": ni.passed, "test": test,
    }


def loss_contrast(pairs: pd.DataFrame, *, metric: str, higher_is_better: bool, confidence: float,
                  n_resamples: int, seed: int) -> dict[str, Any]:
    """Paired contrast of a raw measure: mean and median difference, interval, perplexity gap."""
    arm, ref, strata, _, row = _paired(pairs, confidence=confidence, n_resamples=n_resamples, seed=seed)
    domains = pairs["domain"].astype(str).to_numpy() if pairs["domain"].notna().all() else None
    loc = location(arm - ref)
    out: dict[str, Any] = {**row, "median": loc.median, "heavy_tail": loc.heavy_tail, "gap": None}
    if is_loss_metric(metric, higher_is_better):
        gap = perplexity_gap(
            arm, ref, domains=domains, strata=strata.labels, n_resamples=n_resamples, confidence=confidence,
            seed=seed,
        )
        out["gap"] = {"gap": gap.gap, "low": gap.low, "high": gap.high, "per_domain": gap.per_domain}
    return out


def own_measure(items: pd.DataFrame, *, confidence: float, n_resamples: int, seed: int) -> dict[str, Any]:
    """An arm's own per-item values (column `score`; e.g. KL(exact||arm)): mean, interval, median.

    Not a difference: the run measured the value against its own exact pass
    (paper sections 3.1 and 4.7, KL reported with its median). The interval is
    the percentile bootstrap of the mean, within the items' strata.
    """
    x = items["score"].to_numpy(float)
    strata = strata_of(items)
    means = resample_means(x, strata=strata.labels, n_resamples=n_resamples, seed=seed)
    boot = summarize_resamples([x.mean()], means, confidence=confidence, n=x.shape[0])[0]
    loc = location(x)
    return {
        "n": boot.n,
        "arm_score": loc.mean,
        "difference": loc.mean,
        "median": loc.median,
        "heavy_tail": loc.heavy_tail,
        "low": boot.low,
        "high": boot.high,
        "strata": strata.text,
    }
