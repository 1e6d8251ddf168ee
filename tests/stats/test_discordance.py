"""rf_eval.stats.discordance: sign test and exact McNemar on discordant items (paper section 4.6)."""

from __future__ import annotations

import numpy as np
import pytest

from rf_eval.stats.discordance import mcnemar_exact, sign_test


def _longbench_like():
    # paper 4.6: stock answered 48 items RidgeFill missed, RidgeFill 41 that stock missed
    ref = np.r_[np.ones(48), np.zeros(41), np.ones(100), np.zeros(314)] * 100
    arm = np.r_[np.zeros(48), np.ones(41), np.ones(100), np.zeros(314)] * 100
    return arm, ref


def test_paper_example_p_0_525():
    arm, ref = _longbench_like()
    mc = mcnemar_exact(arm, ref)
    assert (mc.arm_only, mc.ref_only, mc.both, mc.neither) == (41, 48, 100, 314)
    assert round(mc.p_value, 3) == 0.525
    st = sign_test(arm, ref)
    assert (st.wins, st.losses, st.ties) == (41, 48, 414)
    assert st.p_value == pytest.approx(mc.p_value)


def test_booleans_and_no_discordance():
    mc = mcnemar_exact([True, False, True], [True, False, True])
    assert mc.p_value == 1.0 and mc.arm_only == mc.ref_only == 0


def test_sign_test_on_continuous_scores_ignores_ties():
    st = sign_test([0.5, 0.7, 0.2, 0.3], [0.4, 0.7, 0.1, 0.1])
    assert (st.wins, st.losses, st.ties) == (3, 0, 1)
    assert st.p_value == pytest.approx(0.25)


def test_mcnemar_needs_binary_outcomes():
    with pytest.raises(ValueError, match="binary"):
        mcnemar_exact([0.0, 50.0, 100.0], [0.0, 100.0, 100.0])
    with pytest.raises(ValueError, match="same length"):
        sign_test([1, 2], [1])
