"""Measured speedups carry their sample size and an interval (issue #54, item 2): the ratio of median times on
the paired items, a percentile interval from resampling them that holds the estimate, narrows as timings agree,
and is reproducible."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rf_eval.stats.speed import speed_rows


def pairs(ref: list[float], arm: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"prefill_seconds_ref": ref, "prefill_seconds_arm": arm, "length": [1024] * len(ref),
                         "mac_speedup_arm": [1.34] * len(ref)})


def test_the_speedup_its_n_and_an_interval_that_holds_it():
    rng = np.random.default_rng(1)
    ref = list(2.0 + rng.normal(0, 0.3, 40))
    arm = list(1.6 + rng.normal(0, 0.3, 40))
    (row,) = speed_rows(pairs(ref, arm))
    assert row["n"] == 40 and row["speedup"] == float(np.median(ref)) / float(np.median(arm))
    assert row["low"] < row["speedup"] < row["high"]
    assert speed_rows(pairs(ref, arm)) == [row]  # seeded: the same interval again
    (steady,) = speed_rows(pairs([2.0] * 40, [1.6] * 40))
    assert steady["low"] == steady["high"] == steady["speedup"] == 1.25  # timings that agree: no spread
    (few,) = speed_rows(pairs(ref[:3], arm[:3]))
    assert few["high"] - few["low"] > row["high"] - row["low"]  # three prompts say less than forty
