"""Every registered task reading keeps the report-measures contract (kvpress's `default_presses` idea, issue
#39 item 3).

The list is the registry's (`rf_eval.stats.measures.MEASURES`), so a new task's reading, in the package or in
a folder on RF_EVAL_MEASURES_PATH, is tested here the moment it is found (tests/test_throwaway_plugins.py runs a
throwaway one). For each: a task it reads, in two synthetic lm-eval runs (exact and ridge) that log its
default metrics per item, is loaded with no `--metric` and read by exactly those metrics, the first the
primary one; a reading with a table gets its table (title, columns in order, a cell per measure) in the
report's summary, one without gets none; and each metric it names has a one-line note for when it is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

from rf_eval.stats.measures import MEASURES, default_metrics, missing_note, reading, task_measures
from rf_eval.stats.runs import load_runs
from rf_eval.stats.summary import SummaryOptions, study_summary


def a_task(cls) -> str:
    """A task the reading `cls` reads: one it names, else a made-up name ending in its suffix."""
    return sorted(cls.tasks)[0] if cls.tasks else f"probe{cls.suffix}"


@pytest.mark.parametrize("name", list(MEASURES))
def test_every_task_reading_keeps_the_contract(name, lmeval_format, tmp_path):
    cls = MEASURES[name]
    task = a_task(cls)
    found = reading(task)
    assert type(found) is cls and found.name == name
    metrics = default_metrics(task)
    assert metrics and len(set(metrics)) == len(metrics)
    table = task_measures(task)
    if table is not None:
        assert list(metrics) == table.metrics and len({m.key for m in table.measures}) == len(table.measures)

    rng = np.random.default_rng(0)
    for arm, shift, start in (("exact", 0.0, 1.79e9), ("ridge", 0.05, 1.79e9 + 1)):
        lines = []
        for i in range(12):
            values = {m: float(1.0 + rng.random() + shift) for m in metrics}
            doc = {"id": i, "domain": ["prose", "code"][i % 2], "text": f"document {i}"}
            lines.append(lmeval_format.sample_line(i, doc, doc["text"], "", values))
        lmeval_format.write_run(tmp_path, model_args={"pretrained": "/models/tiny", "fill": arm, "split": 12},
                                tasks={task: lines}, started=start)
    runs = load_runs([tmp_path])
    items = runs.items[runs.items.task == task]
    assert list(dict.fromkeys(items.metric)) == list(metrics)
    assert set(items.loc[items.primary.astype(bool), "metric"]) == {metrics[0]}
    tables = study_summary(runs, "exact", SummaryOptions(n_resamples=200))["measures"]
    if table is None:
        assert tables == []
    else:
        (shown,) = tables
        assert shown["title"] == table.title and [c["key"] for c in shown["columns"]] == \
            [m.key for m in table.measures]
        (row,) = shown["rows"]
        assert row["arm"] == "ridge" and all(row["cells"][m.key] is not None for m in table.measures)
    for metric in metrics:
        note = missing_note(task, metric, {})
        assert metric in note and "\n" not in note
