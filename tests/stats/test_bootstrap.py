"""rf_eval.stats.bootstrap: agreement with scipy, strata, shared index matrix, memory cap, coverage."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rf_eval.stats.bootstrap import PairedBootstrap, paired_bootstrap, paired_bootstraps, resample_means


def _scipy_interval(arm, ref, confidence=0.95, seed=0):
    res = stats.bootstrap(
        (arm, ref),
        lambda a, b, axis: np.mean(a - b, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=10_000,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return res.confidence_interval, res.standard_error


@pytest.mark.parametrize("kind", ["normal", "skewed", "accuracy"])
def test_agrees_with_scipy_percentile_within_monte_carlo_error(kind):
    rng = np.random.default_rng(7)
    n = 300
    if kind == "normal":
        ref = rng.normal(size=n)
        arm = ref + rng.normal(0.1, 0.5, size=n)
    elif kind == "skewed":
        ref = rng.exponential(size=n)
        arm = ref + rng.exponential(0.3, size=n) ** 2
    else:
        ref = (rng.random(n) < 0.8) * 100.0
        arm = np.where(rng.random(n) < 0.1, 100.0 - ref, ref)
    ours = paired_bootstrap(arm, ref)
    ci, se = _scipy_interval(arm, ref)
    # The 2.5% and 97.5% quantiles of 10,000 resamples each carry a Monte-Carlo error of
    # about 0.03 standard errors of the mean; two independent estimates differ by <= 0.2 SE
    # with room to spare. Accuracy differences also move in lattice steps of 100/n.
    tol = 0.2 * se + (100.0 / n if kind == "accuracy" else 0.0)
    assert ours.difference == pytest.approx(np.mean(arm - ref))
    assert abs(ours.low - ci.low) < tol
    assert abs(ours.high - ci.high) < tol
    assert ours.low <= ours.lower <= ours.difference <= ours.upper <= ours.high
    assert ours.n == n and ours.n_resamples == 10_000 and ours.confidence == 0.95


def test_result_is_frozen_and_seeded():
    rng = np.random.default_rng(1)
    arm, ref = rng.normal(size=50), rng.normal(size=50)
    a = paired_bootstrap(arm, ref, seed=3)
    assert a == paired_bootstrap(arm, ref, seed=3)
    assert a != paired_bootstrap(arm, ref, seed=4)
    with pytest.raises(AttributeError):
        a.low = 0.0  # type: ignore[misc]
    assert isinstance(a, PairedBootstrap)


def test_strata_keep_their_sizes_in_every_resample():
    # stratum a is all 0, stratum b all 1: any mix-preserving resample has mean exactly n_b / n
    values = np.r_[np.zeros(30), np.ones(10)]
    strata = np.r_[["a"] * 30, ["b"] * 10]
    means = resample_means(values, strata=strata, n_resamples=2_000)
    assert np.allclose(means, 0.25)
    # without strata the mix varies
    assert resample_means(values, n_resamples=2_000).std() > 0.03


def test_stratified_interval_is_narrower_when_strata_explain_variance():
    rng = np.random.default_rng(2)
    strata = np.repeat(["easy", "hard"], 100)
    ref = np.zeros(200)
    arm = np.where(strata == "easy", 10.0, -10.0) + rng.normal(size=200)
    pooled = paired_bootstrap(arm, ref)
    within = paired_bootstrap(arm, ref, strata=strata)
    assert within.high - within.low < 0.3 * (pooled.high - pooled.low)


def test_weights_give_the_mean_of_stratum_means():
    values = np.array([1.0, 2.0, 3.0, 10.0])
    strata = ["a", "a", "a", "b"]
    weights = [1 / 6, 1 / 6, 1 / 6, 1 / 2]
    means = resample_means(values, strata=strata, weights=weights, n_resamples=20_000)
    assert means.mean() == pytest.approx((2.0 + 10.0) / 2, abs=0.02)


def test_shared_index_matrix_for_several_arms():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=80)
    arms = {f"arm{i}": ref + rng.normal(0.1 * i, 1, size=80) for i in range(4)}
    shared = paired_bootstraps(arms, ref, seed=5)
    for name, arm in arms.items():  # the same resamples (summed in another order by BLAS)
        one = paired_bootstrap(arm, ref, seed=5)
        for field in ("difference", "low", "high", "lower", "upper"):
            assert getattr(shared[name], field) == pytest.approx(getattr(one, field), abs=1e-12)


def test_memory_cap_does_not_change_the_result():
    rng = np.random.default_rng(4)
    d = rng.normal(size=(120, 2))
    full = resample_means(d, n_resamples=3_000, seed=9)
    tiny = resample_means(d, n_resamples=3_000, seed=9, max_batch_bytes=16 * 120 * 7)  # 7 rows a batch
    np.testing.assert_allclose(full, tiny)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same length"):
        paired_bootstrap([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap([1, np.nan], [1, 2])
    with pytest.raises(ValueError, match="one label per item"):
        paired_bootstrap([1, 2], [1, 2], strata=["a"])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1, 2], [1, 2], confidence=1.0)
    with pytest.raises(ValueError, match="no items"):
        resample_means(np.empty(0))


@pytest.mark.slow
def test_coverage_of_the_95_percent_interval():
    """2,000 simulated studies with a known mean difference: coverage within 1.5 points of 95%.

    Studies run 20 at a time through `paired_bootstraps` (each study one column
    against a zero reference, so one index matrix per 20 studies, a new seed
    for each batch); the studies' data are independent.
    """
    rng = np.random.default_rng(2026)
    sims, batch, n = 2_000, 20, 216
    truth = 0.8 * 0.1 * -100 + 0.2 * 0.3 * 100  # E[arm - ref] in points
    covered = 0
    for b in range(sims // batch):
        ref = (rng.random((batch, n)) < 0.8) * 100.0
        flip = rng.random((batch, n)) < np.where(ref > 0, 0.1, 0.3)  # right->wrong 10%, wrong->right 30%
        arm = np.where(flip, 100.0 - ref, ref)
        studies = {i: arm[i] - ref[i] for i in range(batch)}
        for res in paired_bootstraps(studies, np.zeros(n), seed=b).values():
            covered += res.low <= truth <= res.high
    rate = covered / sims
    assert stats.binomtest(covered, sims, 0.95).pvalue > 0.001, rate
    assert abs(rate - 0.95) <= 0.015, rate
