"""The report's charts show every arm (issue #54, item 2): points drawn on one another are drawn apart, every
legend entry lies inside its chart, every axis says what it measures and in which unit, and the speed chart
says which mark is which."""

from __future__ import annotations

import re

import pytest

from rf_eval.reports.charts import accuracy_by_length, frontier_chart, speed_chart

ARMS = ["exact", "identity@0.748", "ridge@0.748", "nofill@0.748", "ridge+rows@0.748"]


def test_five_arms_with_one_accuracy_are_five_marks_at_each_length_and_five_legend_entries():
    series = {arm: {1024: 100.0, 2048: 50.0} for arm in ARMS}
    chart = accuracy_by_length([1024, 2048], series)
    for i in range(2):
        marks = {(p["x"], p["y"]) for line in chart["lines"] for p in line["points"][i:i + 1]}
        assert len(marks) == len(ARMS)  # none hidden under another
    assert [entry["arm"] for entry in chart["legend"]] == ARMS
    assert all(entry["y"] + 14 <= chart["height"] for entry in chart["legend"])
    longest = max(len(a) for a in ARMS)
    assert chart["plot"]["right"] + 30 + 6 * longest <= chart["width"]  # the names fit beside the plot
    assert chart["x_label"] == "prompt length (tokens)" and chart["y_label"] == "accuracy (points, 0-100)"


def test_two_arms_at_one_place_on_the_frontier_are_both_drawn_and_the_title_says_why():
    def arm(name):
        return {"arm": name, "lengths": [{"length": 1024, "mac_speedup": 1.34,
                                          "measures": {"acc": {"difference": 0.0, "low": 0.0, "high": 0.0}}}]}

    chart = frontier_chart({"label": "acc", "higher_is_better": True, "unit": "points"},
                           [arm("identity@0.748"), arm("ridge@0.748")])
    (a, b) = chart["points"]
    assert a["cy"] == b["cy"] and b["cx"] - a["cx"] >= 6  # two circles of radius 5, side by side
    assert "another arm's point lies there" in b["title"] and "another" not in a["title"]
    assert chart["y_label"] == "difference from the reference (points)"


def test_the_speed_chart_has_a_legend_for_its_two_marks_and_an_axis_label():
    chart = speed_chart([{"arm": "ridge", "length": 1024, "speedup": 0.9, "ceiling": 1.34}])
    assert [entry["kind"] for entry in chart["legend"]] == ["bar", "ceiling"]
    assert "wall clock" in chart["legend"][0]["label"] and "times" in chart["x_label"]


@pytest.fixture
def report_html(tmp_path, lmeval_format) -> str:
    from rf_eval.cli import main

    lengths = [1024, 2048]
    for arm in ("exact", "identity", "ridge"):  # identity and ridge score alike: their marks coincide
        lmeval_format.accuracy_run(tmp_path / arm, arm, {"niah_single_1_filled": [True, True, False, True]},
                                   lengths=lengths, ceiling=1.0 if arm == "exact" else 1.34)
    html = tmp_path / "r.html"
    assert main(["report", *(str(tmp_path / a) for a in ("exact", "identity", "ridge")), "--reference", "exact",
                 "--html", str(html), "--resamples", "50"]) == 0
    return html.read_text()


def test_every_rendered_chart_labels_its_axes(report_html):
    charts = re.findall(r'<svg (?:id|class)="([\w-]+)".*?</svg>', report_html, re.S)
    assert {"forest-plot", "length-chart"} <= set(charts)
    for name, svg in re.findall(r'<svg (?:id|class)="([\w-]+)"(.*?)</svg>', report_html, re.S):
        labels = re.findall(r'class="axis-label">([^<]+)<', svg)
        want = {"forest-plot": 1, "loss-forest-plot": 1, "speed-chart": 1}.get(name, 2)  # the bars are named on their left
        assert len(labels) >= want, (name, labels)
    forest = re.search(r'<svg id="forest-plot"(.*?)</svg>', report_html, re.S).group(1)
    assert "difference from exact (points)" in forest


def test_a_loss_tasks_primary_measure_gets_its_own_forest_in_nats():
    """The forest shows every task's primary measure (issue #54, item 2): keytoken_nll's key-token ΔNLL in a
    forest of its own, in nats, with no non-inferiority margin (a loss has none here)."""
    from rf_eval.reports.charts import forest_plot
    from rf_eval.stats.summary import loss_forest

    measures = [{"task": "keytoken_nll", "columns": [{"key": "key", "label": "key-token ΔNLL", "metric": "nll_key"}],
                 "rows": [{"arm": "ridge", "cells": {"key": {"difference": 0.35, "low": 0.2, "high": 0.5}}},
                          {"arm": "nofill", "cells": {"key": None}}]}]
    losses = [{"task": "t", "primary": True, "unit": "nats", "rows": [{"arm": "ridge", "difference": 0.1, "low": 0.0,
                                                                       "high": 0.2}]},
              {"task": "u", "primary": True, "unit": "raw", "rows": [{"arm": "ridge", "difference": 5, "low": 4,
                                                                      "high": 6}]}]
    rows = loss_forest(losses, measures)
    assert [(r["group"], r["label"]) for r in rows] == [("ridge", "keytoken_nll: key-token ΔNLL"), ("ridge", "t")]
    chart = forest_plot(rows, margin=None)
    assert chart["margin_x"] is None and len(chart["rows"]) == 2
    longest = max(len(r["label"]) for r in chart["rows"])
    assert min(r["x_low"] for r in chart["rows"]) >= 6.5 * longest  # no label runs into the plot
    assert chart["rows"][0]["x_low"] < chart["rows"][0]["x_point"] < chart["rows"][0]["x_high"]
