"""`rf-eval demo --quick` end to end, offline: fit (cached), the built-in study's four arms through lm_eval,
report; then one arm again from scratch, whose samples must come out file for file the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rf_eval.demo.study import SPLIT, caption, render_study, settings
from rf_eval.demo.table import readme_block, record_path, render_table
from rf_eval.study.spec import load_study

ROOT = Path(__file__).resolve().parents[2]


def test_demo_settings_fit_the_promise(tmp_path):
    quick, full = settings(quick=True), settings(quick=False)
    for s in (quick, full):
        study = load_study(render_study(tmp_path, s, tmp_path / "model", tmp_path / "maps", tmp_path / "docs"))
        assert list(study.arms) == ["exact", "identity", "ridge", "ridge_rows"] and study.reference == "exact"
        assert study.tasks == (*s.ruler_tasks, "keytoken_nll") and study.lengths == s.lengths
        assert study.arms["identity"].args == {"fill": "identity", "split": SPLIT, "reference": "exact"}
        assert study.metadata["docs"] == str(tmp_path / "docs") and study.maps == str(tmp_path / "maps")
        assert all(n > s.tail for n in s.lengths)
    assert 1 <= SPLIT < 30


@pytest.mark.parametrize("quick", [True, False])
def test_readme_demo_tables_are_rendered_from_the_recorded_reports(quick):
    """Each README demo table is `rf-eval demo --readme`'s rendering of the report it recorded."""
    readme = ROOT / "README.md"
    report = json.loads(record_path(readme, quick).read_text())
    assert readme_block(readme.read_text(), quick) == render_table(report, caption(settings(quick), quick))
    assert {a["name"] for a in report["arms"]} == {"exact", "identity", "ridge", "ridge,selector=attention"}


def _samples(out: Path) -> dict[str, str]:
    files = sorted(out.glob("runs/*/*/samples_*.jsonl"))
    return {f"{f.parts[-3]}/{f.name.split('_20')[0]}": f.read_text() for f in files}


def _demo(out: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "rf_eval", "demo", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "report.html").is_file() and (out / "report.md").is_file() and "report:" in done.stdout
    return done


@pytest.mark.slow
def test_quick_demo_runs_end_to_end_and_is_deterministic(tmp_path):
    out = tmp_path / "demo"
    _demo(out)
    first = _samples(out)
    assert len(first) == 4 * 2  # 4 arms x (needle task, keytoken_nll)
    state = json.loads((out / "study.json").read_text())
    (reference,) = out.glob("runs/exact/*/samples_keytoken_nll_*.jsonl")
    for arm in ("identity", "ridge", "ridge_rows"):  # key tokens from the exact arm, shared by every arm
        command = state["arms"][arm]["command"]
        assert json.loads(command[command.index("--metadata") + 1])["key_reference"] == str(reference)
    # the exact arm reads the context: >= 90% on the filled-region samples
    exact = next(v for k, v in first.items() if k.startswith("exact/samples_niah"))
    rows = [json.loads(line) for line in exact.splitlines()]
    filled = [r for r in rows if r.get("filled") == 1]
    assert filled, "no needle fell in the filled region"
    assert sum(r["acc_filled"] for r in filled) / len(filled) >= 0.9
    html = (out / "report.html").read_text()
    assert "identity" in html and "ridge,selector=attention" in html

    # what a newcomer sees (issue #23): the fitted map keeps at least identity's needles, under half its KL
    # and under half its key-token loss
    summary = json.loads((out / "report.json").read_text())
    needles = {row["arm"]: row["arm_score"] * row["n"] / 100 for row in summary["overall"]}
    (keytoken,) = [m for m in summary["measures"] if m["task"] == "keytoken_nll"]
    key = {row["arm"]: row["cells"]["key"]["difference"] for row in keytoken["rows"]}
    kl = {row["arm"]: row["cells"]["kl"]["difference"] for row in keytoken["rows"]}
    assert needles["ridge"] >= needles["identity"], needles
    assert key["ridge"] < key["identity"] / 2 and kl["ridge"] < kl["identity"] / 2, (key, kl)
    # the README's quick-demo table is this run's, character for character
    table = (out / "demo_table.md").read_text()
    assert readme_block((ROOT / "README.md").read_text(), quick=True) == table, (
        "README.md's quick demo table differs from what the demo produced; run "
        "`rf-eval demo --quick --readme README.md` and commit the result:\n" + table)

    # determinism: ridge_rows (map, selector and the shared key tokens) again, from scratch (no done marker, no
    # request cache); the demo re-run skips the three other arms and must write the same samples, byte for byte
    (out / "runs" / "ridge_rows" / "done.json").unlink()
    for db in (out / "cache").glob("ridge_rows_rank*.db"):
        db.unlink()
    old = set(out.glob("runs/ridge_rows/*/samples_*.jsonl"))
    again = _demo(out)
    for arm in ("exact", "identity", "ridge"):
        assert f"{arm}: done before (fingerprint matches), skipped" in again.stdout
    new = sorted(set(out.glob("runs/ridge_rows/*/samples_*.jsonl")) - old)
    assert len(new) == 2
    for file in new:
        assert file.read_text() == first[f"ridge_rows/{file.name.split('_20')[0]}"], file.name
