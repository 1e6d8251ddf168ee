"""rf_eval.stats perplexity gap, mean beside median, and count-matched controls."""

from __future__ import annotations

import numpy as np
import pytest

from rf_eval.stats.controls import control_margin
from rf_eval.stats.perplexity import document_gaps, perplexity_gap
from rf_eval.stats.tails import location


def test_perplexity_gap_is_averaged_per_domain_then_across_domains():
    ref = np.array([2.0, 2.0, 2.0, 3.0])
    arm = ref + np.array([0.01, 0.01, 0.01, 0.10])
    domains = ["prose", "prose", "prose", "code"]
    res = perplexity_gap(arm, ref, domains=domains, n_resamples=2_000)
    expected = (np.expm1(0.01) + np.expm1(0.10)) / 2  # not the plain mean over 4 documents
    assert res.gap == pytest.approx(expected)
    assert res.per_domain == pytest.approx({"prose": np.expm1(0.01), "code": np.expm1(0.10)})
    assert res.low <= res.gap <= res.high
    # equal counts per domain: the plain average over documents
    even = perplexity_gap(arm[[0, 1, 3, 3]], ref[[0, 1, 3, 3]], domains=["a", "a", "b", "b"], n_resamples=100)
    assert even.gap == pytest.approx(document_gaps(arm[[0, 1, 3, 3]], ref[[0, 1, 3, 3]]).mean())


def test_perplexity_gap_interval_resamples_documents_within_domain():
    rng = np.random.default_rng(0)
    ref = rng.normal(2.0, 0.2, size=90)
    arm = ref + rng.normal(0.016, 0.01, size=90)
    res = perplexity_gap(arm, ref, domains=np.repeat(list("abcdef"), 15))
    assert res.low < np.expm1(0.016) < res.high
    assert res.n_documents == 90 and set(res.per_domain) == set("abcdef")


def test_mean_beside_median_flags_heavy_tails():
    # paper section 3: a mean carried by five copy-heavy documents, median 0.004
    kl = np.r_[np.full(95, 0.004), np.full(5, 2.0)]
    loc = location(kl)
    assert loc.median == pytest.approx(0.004) and loc.mean > 0.1
    assert loc.heavy_tail
    assert not location(np.random.default_rng(1).normal(size=200)).heavy_tail
    assert not location([3.0]).heavy_tail
    with pytest.raises(ValueError):
        location([])


def test_control_margin_against_count_matched_controls():
    sel = np.array([100.0, 100, 100, 0, 100, 100])
    c1 = np.array([100.0, 0, 100, 0, 100, 0])
    c2 = np.array([100.0, 100, 0, 0, 100, 0])
    res = control_margin(sel, [c1, c2], selected_count=64, control_counts=[64, 64], n_resamples=2_000)
    assert res.difference == pytest.approx(np.mean(sel - (c1 + c2) / 2))
    with pytest.raises(ValueError, match="count"):
        control_margin(sel, [c1, c2], selected_count=64, control_counts=[64, 128])
    with pytest.raises(ValueError, match="one score per item"):
        control_margin(sel, c1[:3])
    assert control_margin(sel, c1, n_resamples=500).difference == pytest.approx(np.mean(sel - c1))


def test_package_exports_are_lazy():
    import subprocess
    import sys

    code = "import sys, rf_eval.stats as s; assert 'pandas' not in sys.modules; s.binomial_floor(5); print(s.load_runs.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "rf_eval.stats.runs"
