"""rf_eval.stats.margin (`noninferiority`): the binomial floor and which bound binds (paper section 3.4)."""

from __future__ import annotations

import numpy as np
import pytest

from rf_eval.stats.bootstrap import paired_bootstrap
from rf_eval.stats.margin import binomial_floor, decide_noninferiority, noninferiority


@pytest.mark.parametrize(("n", "floor"), [(216, -1.38), (219, -1.36), (138, -2.15)])
def test_floor_matches_the_paper(n, floor):
    assert round(binomial_floor(n), 2) == floor


def test_floor_formula_and_limits():
    assert binomial_floor(1) == pytest.approx(-95.0)
    assert binomial_floor(100, alpha=0.01) == pytest.approx(-100 * (1 - 0.01 ** (1 / 100)))
    assert binomial_floor(10_000) > binomial_floor(100)  # more samples, a tighter floor
    with pytest.raises(ValueError):
        binomial_floor(0)
    with pytest.raises(ValueError):
        binomial_floor(10, alpha=1.5)


def test_floor_binds_when_both_arms_get_nearly_everything_right():
    n = 216
    ref = np.full(n, 100.0)
    arm = ref.copy()  # both perfect: the bootstrap interval collapses to zero
    res = noninferiority(arm, ref, margin=2.0)
    assert res.binding == "floor"
    assert res.bound == pytest.approx(binomial_floor(n))
    assert round(res.bound, 2) == -1.38
    assert res.passed  # -1.38 > -2
    # at n = 138 the floor alone is -2.15: a 2-point test cannot pass (the paper makes no such claim)
    res138 = noninferiority(np.full(138, 100.0), np.full(138, 100.0), margin=2.0)
    assert res138.binding == "floor" and not res138.passed


def test_bootstrap_binds_otherwise():
    rng = np.random.default_rng(0)
    n = 200
    ref = (rng.random(n) < 0.7) * 100.0
    arm = np.where(rng.random(n) < 0.15, 100.0 - ref, ref)
    res = noninferiority(arm, ref, margin=2.0)
    boot = paired_bootstrap(arm, ref, confidence=0.95)
    assert res.binding == "bootstrap"
    assert res.bound == pytest.approx(boot.lower) and res.bound < res.floor
    assert res.bootstrap_lower == pytest.approx(boot.lower)
    assert res.passed == (res.bound > -2.0)


def test_passed_is_strictly_above_minus_margin_and_reuses_a_bootstrap():
    assert not decide_noninferiority(0.0, -2.0, 10_000, margin=2.0).passed
    assert decide_noninferiority(0.0, -1.99, 10_000, margin=2.0).passed
    boot = paired_bootstrap(np.full(50, 100.0), np.full(50, 100.0), confidence=0.95)
    assert noninferiority(None, None, margin=3.0, bootstrap=boot).floor == binomial_floor(50)
    with pytest.raises(ValueError, match="1 - alpha"):
        noninferiority(None, None, margin=3.0, bootstrap=boot, alpha=0.1)
    with pytest.raises(ValueError, match="margin"):
        decide_noninferiority(0.0, 0.0, 10, margin=-1)
