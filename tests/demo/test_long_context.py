"""The README's long-context tables (issue #56 item 7) are `benchmarks/long_context.py`'s rendering of the reports it
recorded: checked against the stored reports, not by rerunning the hour."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("identity", "ridge", "nofill", "fastkv", "gemfilter", "flexprefill", "xattention", "sinkwindow",
            "ridge+flexprefill")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("long_context", ROOT / "benchmarks" / "long_context.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reports(script) -> dict[int, dict]:
    return {n: json.loads((script.RECORDS / f"long_context_{n}.json").read_text()) for n in script.SIZES}


def test_the_readme_block_is_the_rendering_of_the_stored_reports(script, reports):
    text = (ROOT / "README.md").read_text()
    block = text.split(script.BEGIN, 1)[1].split(script.END, 1)[0].strip("\n") + "\n"
    assert block == script.render(reports).rstrip("\n") + "\n"


@pytest.mark.parametrize("length", [2048, 4096, 8192])
def test_each_length_ran_every_family_at_both_budgets_within_them(script, reports, length):
    """Every arm of the issue at each budget, each within its budget (the realised MAC fraction the frontier
    plots), and every arm scored on the documents."""
    report = reports[length]
    budgets = script.SIZES[length][0]
    arms = {a["name"]: a for a in report["arms"]}
    assert set(arms) == {"exact", *(f"{f}@{b:g}" for f in FAMILIES for b in budgets)}
    for name, arm in arms.items():
        if name == "exact":
            continue
        budget = float(name.rsplit("@", 1)[1])
        assert arm["cost"] and all(c["macs_fraction"] <= budget + 1e-9 for c in arm["cost"]), name
    (kt,) = [m for m in report["measures"] if m["task"] == "keytoken_nll"]
    assert {r["arm"] for r in kt["rows"]} == set(arms) - {"exact"}
