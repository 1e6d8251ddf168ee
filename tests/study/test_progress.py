"""A study's progress lines (issue #54, item 3): an arm's requests as done/total with an estimate of the time
left once one arm has finished (every arm runs the same requests), and the arms done out of all."""

from __future__ import annotations

import io
import sqlite3

from rf_eval.study.jobs import ArmJob, Progress


def _cache(out, arm: str, rows: int) -> None:
    (out / "cache").mkdir(exist_ok=True)
    with sqlite3.connect(out / "cache" / f"{arm}_rank0.db") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS unnamed (key TEXT PRIMARY KEY, value BLOB)")
        conn.executemany("INSERT INTO unnamed VALUES (?, ?)", [(f"{arm}{i}", b"") for i in range(rows)])


def _job(name: str) -> ArmJob:
    return ArmJob(name, ("lm_eval",), "out", "f", "done.json")


def test_before_an_arm_finishes_the_count_and_after_it_done_over_total_with_time_left(tmp_path):
    progress = Progress(tmp_path, total=3, done=0)
    progress.stream = io.StringIO()
    assert progress.request_line(120, 60.0) == "120 requests done, 60s"
    _cache(tmp_path, "exact", 480)
    progress.finished(_job("exact"), 200.0)
    assert progress.stream.getvalue() == "[arms 1/3] exact done in 200s; about 400s left\n"
    assert progress.request_line(120, 60.0) == "120/480 requests, 60s, about 180s left"
    assert progress.request_line(0, 5.0) == "0/480 requests, 5s"
    assert progress.request_line(500, 70.0) == "500 requests done, 70s"  # more than an arm had: no estimate
