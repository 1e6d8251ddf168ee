"""`rf-eval demo --quick` end to end, offline: fit (cached), four arms through lm_eval, report; twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rf_eval.demo.study import SPLIT, settings


def test_demo_settings_fit_the_promise():
    quick, full = settings(quick=True), settings(quick=False)
    assert list(quick.arms) == list(full.arms) == ["exact", "identity", "ridge", "ridge_rows"]
    assert all(n > quick.tail for n in quick.lengths) and all(n > full.tail for n in full.lengths)
    assert 1 <= SPLIT < 30


def _samples(out: Path) -> dict[str, str]:
    files = sorted(out.glob("runs/*/*/samples_*.jsonl"))
    return {f"{f.parts[-3]}/{f.name.split('_20')[0]}": f.read_text() for f in files}


@pytest.mark.slow
def test_quick_demo_runs_end_to_end_and_is_deterministic(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "rf_eval", "demo", "--quick", "--out", str(out)],
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert (out / "report.html").is_file() and "report:" in done.stdout
        outs.append(out)
    first, second = _samples(outs[0]), _samples(outs[1])
    assert len(first) == 4 * 2 and first == second  # 4 arms x (needle task, keytoken_nll), identical
    # the exact arm reads the context: >= 90% on the filled-region samples
    exact = next(v for k, v in first.items() if k.startswith("exact/samples_niah"))
    rows = [json.loads(line) for line in exact.splitlines()]
    filled = [r for r in rows if r.get("filled") == 1]
    assert filled, "no needle fell in the filled region"
    assert sum(r["acc_filled"] for r in filled) / len(filled) >= 0.9
    html = (outs[0] / "report.html").read_text()
    assert "identity" in html and "ridge,selector=attention" in html
