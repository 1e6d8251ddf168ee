"""rf_eval.reports: chart geometry, number formatting and escaping (templates stay dumb)."""

from __future__ import annotations

import pytest

from rf_eval.reports.charts import accuracy_by_length, forest_plot, speed_chart
from rf_eval.reports.render import fmt, md, percent, pvalue, render_latex, render_markdown, sig, signed, tex


def _row(group, label, d, lo, hi, passed=False):
    return {"group": group, "label": label, "difference": d, "low": lo, "high": hi, "passed": passed}


def test_forest_plot_geometry():
    rows = [_row("ridge", "overall", -0.5, -1.5, 0.5, True), _row("identity", "overall", -20.0, -30.0, -10.0)]
    f = forest_plot(rows, margin=2.0, colours={"ridge": "#111111"})
    a, b = f["rows"]
    assert a["x_low"] < a["x_point"] < a["x_high"] and b["x_low"] < b["x_point"] < b["x_high"]
    assert b["x_high"] < f["margin_x"] < a["x_point"] < f["zero_x"]  # -10 < -2 < -0.5 < 0
    assert a["y"] < b["y"] and a["colour"] == "#111111" and a["passed"] and not b["passed"]
    assert f["ticks"][0]["x"] >= 0 and f["ticks"][-1]["x"] <= f["width"]


def test_length_and_speed_charts():
    c = accuracy_by_length([4096, 8192], {"exact": {4096: 100.0, 8192: 50.0}, "ridge": {8192: 0.0}})
    exact, ridge = c["lines"]
    assert exact["points"][0]["y"] == c["plot"]["top"] and exact["points"][1]["y"] < c["plot"]["bottom"]
    assert ridge["points"][0]["y"] == c["plot"]["bottom"] and len(ridge["points"]) == 1
    s = speed_chart([{"arm": "ridge", "length": 4096, "speedup": 1.5, "ceiling": 1.8}, {"arm": "r", "length": 1, "speedup": 0.9, "ceiling": None}])
    assert s["bars"][0]["x1"] < s["bars"][0]["ceiling_x"] and s["bars"][1]["ceiling_x"] is None
    assert s["bars"][1]["x1"] < s["one_x"]


def test_filters_round_only_at_the_end():
    assert signed(-1.375) == "-1.38" and signed(0.0) == "+0.00" and signed(None) == "–"
    assert fmt(83.333) == "83.3" and fmt(float("nan")) == "–"
    assert sig(0.0123456) == "+0.01235" and percent(0.016) == "+1.60%"
    assert pvalue(0.52501) == "0.525" and pvalue(1e-9) == "<0.001"
    assert tex("a_b & 50% #1 {x} ~^\\") == r"a\_b \& 50\% \#1 \{x\} \textasciitilde{}\textasciicircum{}\textbackslash{}"
    assert md("a|b\nc") == "a\\|b c"


@pytest.fixture
def tiny_summary():
    row = {"arm": "ridge_arm", "n": 10, "arm_score": 90.0, "ref_score": 92.0, "difference": -2.0, "low": -6.0,
           "high": float("nan"), "lower": -5.0, "floor": -25.9, "bound": -25.9, "binding": "floor", "passed": False,
           "test": {"name": "McNemar", "wins": 1, "losses": 3, "p": 0.625}, "strata": "RULER task × length (4 strata)",
           "mac_speedup": 1.5, "measured_speedup": None}
    return {
        "reference": "exact_arm", "margin": 2.0, "confidence": 0.95, "n_resamples": 100, "seed": 0,
        "arms": [{"name": "exact_arm", "model": "hf", "model_args": "fill=exact", "started": "2026", "results_files": [],
                  "n_items": 10, "is_reference": True, "registration": None}],
        "tasks": [{"task": "niah_1", "metric": "score", "unit": "points", "primary": True, "higher_is_better": True,
                   "reference": {"n": 10, "score": 92.0}, "rows": [row]}],
        "overall": [row], "losses": [], "lengths": [], "by_length": [], "task_length": [], "forest": [],
        "speed": [], "controls": [], "has_ledger": False, "notes": [],
    }  # fmt: skip


def test_latex_and_markdown_escape_names_and_mark_missing_numbers(tiny_summary):
    tex_out = render_latex(tiny_summary)
    assert r"ridge\_arm" in tex_out and r"niah\_1" in tex_out and r"exact\_arm" in tex_out
    assert r"[$-6.00$, --]" in tex_out  # a missing bound prints as --, never as a bare unicode dash
    assert "–" not in tex_out
    md_out = render_markdown(tiny_summary)
    assert ("| ridge_arm | 10 | 90.0 | 92.0 | -2.00 | [-6.00, –] | -25.90 | floor | no | 1.50× | – | "
            "RULER task × length (4 strata) |") in md_out  # the cost beside it: MAC speedup, none measured
    assert r"1.50$\times$" in tex_out
    assert r"RULER task $\times$ length (4 strata)" in tex_out and "×" not in tex_out


def test_measure_cells_mean_interval_median_and_count():
    from rf_eval.reports.render import _environment

    cell = _environment(latex=False).filters["measure_cell"]
    delta = {"n": 63, "difference": 0.0301, "low": 0.012, "high": 0.0456, "median": 0.004, "heavy_tail": True}
    assert cell(delta, "delta", 90) == "+0.030 [+0.012, +0.046], median +0.004 (heavy tail) (n=63)"
    assert cell({**delta, "heavy_tail": False}, "delta", 63) == "+0.030 [+0.012, +0.046]"
    assert cell({**delta, "difference": 0.016, "low": 0.01, "high": 0.02}, "gap", 63) == "+1.60% [+1.00%, +2.00%]"
    assert cell({**delta, "difference": 0.0123}, "own", 63) == "0.0123 [0.012, 0.0456], median 0.004"
    assert cell(None, "delta", 63) == "–"
    tex_cell = _environment(latex=True).filters["measure_cell"]
    assert tex_cell(delta, "delta", 63) == "$+0.030$ [$+0.012$, $+0.046$], median $+0.004$ (heavy tail)"
    assert tex_cell(None, "own", 63) == "--"
