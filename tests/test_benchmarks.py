"""The benchmark scripts: their figures are well-formed, and the README table is written from them.

Speed itself is not asserted here (benchmarks measure it); these check that the
scripts run at toy size and that the table states each target and its outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import run  # noqa: E402  (benchmarks/run.py)


@pytest.mark.parametrize(
    ("value", "target", "want"),
    [(1.02, "<= 1.03", "met"), (1.04, "<= 1.03", "missed"), (0.9, ">= 0.90", "met"), (0.89, ">= 0.90", "missed"),
     (0.99, "< 1", "met"), (1.0, "< 1", "missed"), (5.0, "", ""), (1.0, "~1.0 (flat)", "met"),
     (1.2, "~1.0 (flat)", "missed")],
)
def test_targets_are_judged(value, target, want):
    assert run.meets(value, target) == want


def test_engine_benchmark_at_toy_size(tmp_path):
    out = tmp_path / "engine.json"
    subprocess.run([sys.executable, str(BENCH / "bench_engine.py"), "--n", "320", "--tail", "64", "--layers", "8",
                    "--hidden", "128", "--repeats", "1", "--skip-memory", "--device", "cpu", "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    figures = json.loads(out.read_text())
    prefix = 320 - 64
    # every arm's ceiling is the cost model's, and rows only lower it
    assert figures["N=320 ridge MAC ceiling"] > figures["N=320 ridge+10% rows MAC ceiling"] > 1.0
    assert figures["N=320 ridge+10% rows: exact rows"] == round(0.1 * 320)  # 10% of the prompt's rows
    assert 0 < figures["N=320 probe: exact rows"] <= prefix
    assert figures["N=320 probe speedup / MAC ceiling with rows + sweep"] > \
        figures["N=320 probe speedup / MAC ceiling with its rows"]
    for name, value in figures.items():
        if name != "targets":
            assert value > 0, name
    assert figures["targets"]["N=320 partial path, every row exact / plain forward"] == "<= 1.05"
    assert "N=320 engine exact / plain forward" not in figures  # an A/A of one dispatch, replaced
    assert set(figures["targets"]) <= set(figures)


def test_readme_table_states_targets_and_outcomes(tmp_path):
    results = {
        "engine": {"N=4096 ridge speedup / MAC ceiling": 0.95, "N=4096 engine exact / plain forward": 1.05,
                   "targets": {"N=4096 ridge speedup / MAC ceiling": ">= 0.90",
                               "N=4096 engine exact / plain forward": "<= 1.03"}},
        "rarecache": {"T": 2048, "rows": [{"rho": 0.2, "share_of_ceiling": 0.8}]},
        "bootstrap": {"error": "exit 1"},
    }
    info = {"date": "2026-11-30", "cores": 2, "machine": "x86_64", "torch": "2.13.0+cpu", "torch_threads": 2,
            "cuda": None}
    table = run.markdown(results, info, "python benchmarks/run.py")
    lines = table.splitlines()
    assert "| engine: N=4096 ridge speedup / MAC ceiling | 0.95 | >= 0.90 | met |" in lines
    assert "| engine: N=4096 engine exact / plain forward | 1.05 | <= 1.03 | missed |" in lines
    assert any(line.startswith("| RaReCache rho=0.2") and line.endswith("| 0.8 | >= 0.85 | missed |")
               for line in lines)
    assert "Failed suites (see the log): bootstrap." in lines
    assert "2 cores" in lines[0] and "`python benchmarks/run.py`" in lines[0]


@pytest.mark.slow
def test_run_rewrites_the_readme_table(tmp_path):
    """The README's command, on its cheapest suite: JSON written, the table between the markers replaced."""
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{run.BEGIN}\nold table\n{run.END}\nafter\n")
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "bootstrap", "--out", str(out),
                    "--readme", str(readme)], check=True, capture_output=True, text=True, timeout=600)
    saved = json.loads(out.read_text())
    assert saved["machine"]["cores"] and saved["runs"]["bootstrap"]["argv"][0] == "bench_bootstrap.py"
    text = readme.read_text()
    assert text.startswith(f"intro\n{run.BEGIN}\nMeasured ") and text.endswith(f"{run.END}\nafter\n")
    assert "old table" not in text
    assert "| rf_eval paired_bootstrap, one index matrix per comparison: seconds |" in text
