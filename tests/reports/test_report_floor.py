"""`rf-eval report` shows each filled arm's engine floor (`rf_eval.engine_floor`, paper sections 4.3, 9)."""

from __future__ import annotations

import json

from rf_eval.cli import main
from rf_eval.reports.render import engine_floor
from rf_eval.stats import load_runs

FLOOR = {"bitwise": True, "max_abs": 0.0, "kl": 0.0, "first_diff": None, "why": "same computation",
         "filled_kernel": {"bitwise": False, "max_abs": 7.15e-07, "kl": 1.34e-14, "first_diff": "layer 4 keys",
                           "why": "masked SDPA over the key rows; stock uses is_causal"},
         "probe_tokens": 64, "split": 3}


def runs_with_a_floor(tmp_path, lmeval_format):
    correct = {"t": [True, False, True, True]}
    lmeval_format.accuracy_run(tmp_path / "exact", "exact", correct)
    results = lmeval_format.accuracy_run(tmp_path / "ridge", "ridge", correct)
    data = json.loads(results.read_text())
    data["config"]["rf_eval"] = {"fill": "ridge", "reference": "exact", "engine_floor": FLOOR}
    results.write_text(json.dumps(data))
    return tmp_path / "exact", tmp_path / "ridge"


def test_runs_read_the_engine_floor(tmp_path, lmeval_format):
    runs = load_runs(runs_with_a_floor(tmp_path, lmeval_format))
    floors = {a.name: a.engine_floor for a in runs.arms}
    assert floors == {"exact": None, "ridge": FLOOR}


def test_engine_floor_text():
    assert engine_floor({"engine_floor": FLOOR}) == "partial path bitwise; filled-row kernel max |Δ| 7.2e-07, KL 1.3e-14"
    assert engine_floor({"engine_floor": {"bitwise": False, "max_abs": 1e-3, "kl": 2e-6}}) == (
        "partial path max |Δ| 0.001, KL 2e-06")
    assert engine_floor({}) == "–" and engine_floor({"engine_floor": None}) == "–"


def test_report_shows_the_floor_beside_the_filled_arm(tmp_path, lmeval_format):
    exact, ridge = runs_with_a_floor(tmp_path, lmeval_format)
    out = tmp_path / "out"
    assert main(["report", str(exact), str(ridge), "--reference", "exact", "--markdown", str(out / "r.md"),
                 "--html", str(out / "r.html"), "--latex", str(out / "r.tex")]) == 0
    md = (out / "r.md").read_text()
    assert "| arm | model_args | items | cost: MAC speedup over exact (measured) | engine floor |" in md
    assert "| ridge | `fill=ridge,pretrained=/models/tiny,split=12` | 4 | – | partial path bitwise; filled-row kernel max \\|Δ\\| 7.2e-07, KL 1.3e-14 |" in md
    assert "| exact (reference) | `fill=exact,pretrained=/models/tiny,split=12` | 4 | – | – |" in md
    html = (out / "r.html").read_text()
    assert "<th class=\"text\">engine floor</th>" in html and "filled-row kernel max |Δ| 7.2e-07, KL 1.3e-14" in html
    tex = (out / "r.tex").read_text()
    assert "% engine floor of ridge: partial path bitwise; filled-row kernel max abs diff 7.2e-07" in tex


def test_report_without_floors_has_no_floor_column(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False]})
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", {"t": [True, True]})
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--reference", "exact",
                 "--html", str(tmp_path / "r.html"), "--markdown", str(tmp_path / "r.md")]) == 0
    assert "engine floor" not in (tmp_path / "r.md").read_text()
