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


def test_timings_paired_in_time_are_used_where_the_arm_recorded_them_and_a_speedup_above_the_ceiling_is_flagged():
    """#55 item 6: the exact prefill timed beside the arm's in its run (`exact_prefill_seconds`) is the
    reference, not the reference run's own timings (another process, another time); a measured speedup
    above the MAC ceiling (1.34) is flagged."""
    p = pairs([9.0] * 8, [1.6] * 8)  # the reference run, timed while the machine was busy: 5.6x
    (separate,) = speed_rows(p)
    assert separate["timing"] == "separate runs" and separate["speedup"] == 9.0 / 1.6 and separate["above_ceiling"]
    p["exact_prefill_seconds_arm"] = [2.0] * 8
    (paired,) = speed_rows(p)
    assert paired["timing"] == "paired in time" and paired["speedup"] == 1.25 and not paired["above_ceiling"]
    assert paired["ref_seconds"] == 2.0 and paired["n"] == 8


def test_a_speedup_above_the_ceiling_is_flagged_in_every_format(tmp_path, lmeval_format):
    from rf_eval.reports.render import render_html, render_latex, render_markdown
    from rf_eval.stats.runs import load_runs
    from rf_eval.stats.summary import SummaryOptions, study_summary

    truth = list(np.random.default_rng(4).random(20) < 0.8)
    for i, (arm, ceiling, seconds) in enumerate([("exact", 1.0, 10.0), ("fast", 1.5, 1.0)]):
        lmeval_format.accuracy_run(tmp_path / arm, arm, {"niah_single_1_filled": truth}, lengths=[1024],
                                   ceiling=ceiling, timings=[seconds], started=1.79e9 + i)
    s = study_summary(load_runs([tmp_path]), "exact", SummaryOptions(n_resamples=100))
    (row,) = s["speed"]
    assert row["above_ceiling"] and row["timing"] == "separate runs"
    html, md, tex = render_html(s), render_markdown(s), render_latex(s)
    assert "Above the ceiling" in html and "above the ceiling</td>" in html
    assert "**above the ceiling**" in md and "separate runs" in md
    assert r"\textbf{above}" in tex and "separate runs" in tex
