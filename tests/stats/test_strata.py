"""Bootstrap strata (paper section 3.4): the pooled `ruler_filled` task resamples within RULER task and length."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rf_eval.stats.bootstrap import paired_bootstrap
from rf_eval.stats.runs import load_runs
from rf_eval.stats.strata import strata_of
from rf_eval.stats.summary import SummaryOptions, study_summary

TASKS = ("niah_single_1", "niah_multikey_1")


def _cells(lengths, fails=()):
    """10 samples per (RULER task, length), all right except the cells in `fails`, all wrong."""
    return {(t, n): [(t, n) not in fails] * 10 for t in TASKS for n in lengths}


def test_the_rule_names_only_the_facts_that_split_the_items():
    frame = pd.DataFrame({
        "task": ["ruler_filled"] * 4, "filter": ["none"] * 4, "subtask": ["a", "a", "b", "b"],
        "domain": [None] * 4, "length": [1024, 2048, 1024, 2048],
    })  # fmt: skip
    s = strata_of(frame)
    assert s.by == ("RULER task", "length") and s.count == 4 and s.text == "RULER task × length (4 strata)"
    assert len(set(s.labels)) == 4
    one = strata_of(frame[frame.length == 1024])
    assert one.by == ("RULER task",) and one.text == "RULER task (2 strata)"
    none = strata_of(frame[(frame.length == 1024) & (frame.subtask == "a")])
    assert none.labels is None and none.text == "none"
    two_tasks = frame.assign(task=["x", "x", "y", "y"], subtask=None, length=1024)
    assert strata_of(two_tasks).text == "task (2 strata)"


@pytest.fixture(scope="module")
def pooled(tmp_path_factory, lmeval_format):
    """Two RULER tasks at two lengths in one `ruler_filled` task; ridge fails every sample of one cell."""
    out = tmp_path_factory.mktemp("pooled")
    lmeval_format.pooled_ruler_run(out, "exact", _cells([1024, 2048]), started=1.79e9)
    lmeval_format.pooled_ruler_run(out, "ridge", _cells([1024, 2048], {("niah_multikey_1", 2048)}), started=1.79e9 + 1)
    rng = np.random.default_rng(0)
    noisy = {cell: list(rng.random(10) < 0.7) for cell in _cells([1024, 2048])}
    lmeval_format.pooled_ruler_run(out, "identity", noisy, started=1.79e9 + 2)
    return out


def test_pooled_ruler_filled_resamples_within_ruler_task_and_length(pooled):
    runs = load_runs([pooled])
    items = runs.items
    assert set(items.subtask) == set(TASKS) and set(items.length) == {1024, 2048}
    s = study_summary(runs, "exact", SummaryOptions(n_resamples=2_000, controls={"ridge": ["identity"]}))
    (task,) = s["tasks"]
    ridge = task["rows"][0]
    assert task["task"] == "ruler_filled" and ridge["arm"] == "ridge" and ridge["n"] == 40
    # every (RULER task, length) cell keeps its 10 samples in each resample, and the arms differ
    # by the same amount on each sample of a cell: the interval is the point, -25 points
    assert ridge["strata"] == "RULER task × length (4 strata)"
    assert ridge["difference"] == pytest.approx(-25.0)
    assert ridge["low"] == pytest.approx(-25.0) and ridge["high"] == pytest.approx(-25.0)
    # one stratum for the pooled task (what `rf-eval report` did before): a wide interval
    arm = items[items.arm == "ridge"].sort_values("doc_id").score.to_numpy()
    ref = items[items.arm == "exact"].sort_values("doc_id").score.to_numpy()
    flat = paired_bootstrap(arm, ref, n_resamples=2_000)
    assert flat.difference == pytest.approx(-25.0) and flat.low < -30 and flat.high > -20
    # the same strata in the pooled row, per length (within RULER task) and for the controls
    assert s["overall"][0]["strata"] == "RULER task × length (4 strata)" and s["overall"][0]["high"] == pytest.approx(-25.0)
    assert {r["length"]: r["rows"][0]["strata"] for r in s["by_length"]} == {
        1024: "RULER task (2 strata)", 2048: "RULER task (2 strata)"}
    assert s["controls"][0]["strata"] == "RULER task × length (4 strata)"


def test_within_ruler_task_alone_where_the_samples_have_one_length(tmp_path, lmeval_format):
    lmeval_format.pooled_ruler_run(tmp_path, "exact", _cells([1024]), started=1.79e9)
    lmeval_format.pooled_ruler_run(tmp_path, "ridge", _cells([1024], {("niah_multikey_1", 1024)}), started=1.79e9 + 1)
    s = study_summary(load_runs([tmp_path]), "exact", SummaryOptions(n_resamples=1_000))
    row = s["tasks"][0]["rows"][0]
    assert row["strata"] == "RULER task (2 strata)"
    assert row["difference"] == row["low"] == row["high"] == pytest.approx(-50.0)


def test_loss_strata_are_domain_and_length_and_the_gap_keeps_domain_weights(tmp_path, lmeval_format):
    docs = [{"domain": d, "nll_all": 2.0, "nll_novel": 2.0, "nll_key": 3.0} for d in ("prose", "code") for _ in range(4)]
    lmeval_format.keytoken_run(tmp_path, "exact", docs, started=1.79e9)
    shifted = [{**d, "nll_novel": d["nll_novel"] + (0.1 if d["domain"] == "code" else 0.0)} for d in docs]
    lmeval_format.keytoken_run(tmp_path, "ridge", shifted, started=1.79e9 + 1)
    (table,) = study_summary(load_runs([tmp_path]), "exact", SummaryOptions(n_resamples=1_000))["measures"]
    novel = table["rows"][0]["cells"]["novel"]
    gap = table["rows"][0]["cells"]["novel_gap"]
    assert novel["strata"] == "domain (2 strata)"
    assert novel["difference"] == novel["low"] == novel["high"] == pytest.approx(0.05)  # within domain: fixed
    assert gap["difference"] == gap["low"] == gap["high"] == pytest.approx(np.expm1(0.1) / 2)
