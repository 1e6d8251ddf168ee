"""`rf-eval demo --quick` end to end, offline: fit (cached), the built-in study's four arms through lm_eval,
report; then one arm again from scratch, whose samples must come out file for file the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warm_start import run_argv

from rf_eval.demo.study import SPLIT, caption, render_study, settings
from rf_eval.demo.table import readme_block, record_path, render_table
from rf_eval.prefill_cost import MEASURED_FIELDS
from rf_eval.study.study_file import load_study

ROOT = Path(__file__).resolve().parents[2]
ROWS = "ridge,selector=attention"
#: the demo's arms beside exact, named as its report names them, at a budget of 0.7
ARMS = ["identity@0.7", "ridge@0.7", ROWS, "nofill@0.7"]


def test_demo_settings_fit_the_promise(tmp_path):
    quick, full = settings(quick=True), settings(quick=False)
    for s in (quick, full):
        study = load_study(render_study(tmp_path, s, tmp_path / "model", tmp_path / "maps", tmp_path / "docs", 0.7))
        assert list(study.arms) == ["exact", *ARMS] and study.reference == "exact"
        assert study.tasks == (*s.ruler_tasks, "keytoken_nll") and study.lengths == s.lengths
        assert study.arms["identity@0.7"].args == {"fill": "identity", "split": SPLIT, "budget": 0.7, "reference": "exact"}
        assert study.arms["nofill@0.7"].args == {"fill": "nofill", "split": SPLIT, "budget": 0.7, "reference": "exact"}
        assert study.arms["ridge@0.7"].args["budget"] == 0.7 and "budget" not in study.arms[ROWS].args
        assert study.metadata["docs"] == str(tmp_path / "docs") and study.maps == str(tmp_path / "maps")
        assert all(n > s.tail for n in s.lengths)
    assert 1 <= SPLIT < 30


def test_the_shared_budget_is_ridges_cost_at_the_demo_tail():
    """`ridge_budget`: ridge's MAC fraction at the demo's tail and needle length (recomputed here from the cost
    model's parts), rounded down, so ridge at that budget keeps about the demo's tail at that length."""
    from transformers import LlamaConfig

    from rf_eval.demo.study import ridge_budget
    from rf_eval.mac_model import layer_costs

    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192)
    s = settings(quick=True)
    n, tail, costs = s.lengths[0], s.tail, layer_costs(config)
    exact = sum(n * (c.write + c.rest) + c.attn_per_key * n * (n + 1) // 2 for c in costs)
    d = config.hidden_size
    late = sum(tail * (c.write + c.rest) + c.attn_per_key * (tail * (tail + 1) // 2 + (n - tail) * tail)
               + (n - tail) * (c.write + (d * d if i > SPLIT else 0)) for i, c in enumerate(costs) if i >= SPLIT)
    ridge = sum(n * (c.write + c.rest) + c.attn_per_key * n * (n + 1) // 2 for c in costs[:SPLIT]) + late
    vocab = d * config.vocab_size
    fraction = (ridge + vocab) / (exact + vocab)
    assert ridge_budget(config, s) == int(fraction * 1000) / 1000
    assert 0.5 < ridge_budget(config, s) < 0.9


@pytest.mark.parametrize("quick", [True, False])
def test_readme_demo_tables_are_rendered_from_the_recorded_reports(quick):
    """Each README demo table is `rf-eval demo --readme`'s rendering of the report it recorded."""
    readme = ROOT / "README.md"
    report = json.loads(record_path(readme, quick).read_text())
    assert readme_block(readme.read_text(), quick) == render_table(report, caption(settings(quick), quick))
    budget = next(a["budget"] for a in report["arms"] if a["name"].startswith("ridge@"))
    assert {a["name"] for a in report["arms"]} == {"exact", f"identity@{budget:g}", f"ridge@{budget:g}",
                                                   "ridge,selector=attention", f"nofill@{budget:g}"}


def _unmeasured(text: str) -> str:
    """A samples file's lines without the fields a rerun measures anew (the prefill seconds)."""
    rows = [json.loads(line) for line in text.splitlines()]
    return "\n".join(json.dumps({k: v for k, v in r.items() if k not in MEASURED_FIELDS}) for r in rows)


def _samples(out: Path) -> dict[str, str]:
    files = sorted(out.glob("runs/*/*/samples_*.jsonl"))
    return {f"{f.parts[-3]}/{f.name.split('_20')[0]}": _unmeasured(f.read_text()) for f in files}


#: the README's first command, as this test runs it (tests/test_readme.py checks the README names it)
QUICK_DEMO = ["rf-eval", "demo", "--quick"]


def _demo(out: Path) -> subprocess.CompletedProcess:
    done = run_argv([sys.executable, "-m", "rf_eval", *QUICK_DEMO[1:], "--out", str(out)], timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "report.html").is_file() and (out / "report.md").is_file() and "report:" in done.stdout
    return done


@pytest.mark.slow
def test_quick_demo_runs_end_to_end_and_is_deterministic(tmp_path):
    out = tmp_path / "demo"
    _demo(out)
    first = _samples(out)
    assert len(first) == 5 * 2  # 5 arms x (needle task, keytoken_nll)
    state = json.loads((out / "study.json").read_text())
    (reference,) = out.glob("runs/exact/*/samples_keytoken_nll_*.jsonl")
    budget = next(float(a.split("@")[1]) for a in state["arms"] if a.startswith("ridge@"))
    for arm in (f"identity@{budget:g}", f"ridge@{budget:g}", ROWS, f"nofill@{budget:g}"):  # key tokens from exact
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

    # what a newcomer sees (issue #23), now at one cost (issue #38): at the budget they share, the fitted map
    # keeps at least identity's needles, under half its KL and under half its key-token loss, and the compute
    # spent on a longer tail instead (nofill) loses more than either fill
    summary = json.loads((out / "report.json").read_text())
    assert next(a["budget"] for a in summary["arms"] if a["name"].startswith("ridge@")) == budget
    ridge, identity, nofill = (f"{fill}@{budget:g}" for fill in ("ridge", "identity", "nofill"))
    needles = {row["arm"]: row["arm_score"] * row["n"] / 100 for row in summary["overall"]}
    (keytoken,) = [m for m in summary["measures"] if m["task"] == "keytoken_nll"]
    key = {row["arm"]: row["cells"]["key"]["difference"] for row in keytoken["rows"]}
    kl = {row["arm"]: row["cells"]["kl"]["difference"] for row in keytoken["rows"]}
    assert needles[ridge] >= needles[identity], needles
    assert key[ridge] < key[identity] / 2 and kl[ridge] < kl[identity] / 2, (key, kl)
    assert key[nofill] > key[identity] and kl[nofill] > kl[identity], (key, kl)
    assert key["ridge,selector=attention"] < key[ridge], key  # the rows buy a lower loss ...
    # the cost half: the three fills spent the same budget, within one tail row of it; the attention rows cost more
    costs = {a["name"]: {c["length"]: c for c in a["cost"]} for a in summary["arms"]}
    for arm in (ridge, identity, nofill):
        assert all(budget - 0.01 < c["macs_fraction"] <= budget for c in costs[arm].values()), costs[arm]
    assert all(c["macs_fraction"] > budget for c in costs["ridge,selector=attention"].values())  # ... for more
    assert "Quality-cost frontier" in html and html.count('class="frontier-chart"') == 2
    (matched,) = summary["budgets"]
    assert matched["budget"] == budget and {a["arm"] for a in matched["arms"]} == {ridge, identity, nofill}
    # the README's quick-demo table is this run's, character for character
    table = (out / "demo_table.md").read_text()
    assert readme_block((ROOT / "README.md").read_text(), quick=True) == table, (
        "README.md's quick demo table differs from what the demo produced; run "
        "`rf-eval demo --quick --readme README.md` and commit the result:\n" + table)

    # determinism: the rows arm (map, selector and the shared key tokens) again, its own lm_eval command on a
    # needle sample and two documents, from scratch (another output folder, no request cache): the samples are
    # the first run's, line for line, but for the measured prefill seconds
    command = list(state["arms"][ROWS]["command"])
    subset = {"niah_single_1_filled": [0], "keytoken_nll": [0, 1]}
    for flag, value in (("--output_path", str(tmp_path / "again")), ("--use_cache", str(tmp_path / "again-cache")),
                        ("--samples", json.dumps(subset))):
        command[command.index(flag) + 1] = value
    done = run_argv(command, timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for file in sorted((tmp_path / "again").glob("*/samples_*.jsonl")):
        task = file.name.split("samples_")[1].rsplit("_", 1)[0]
        before = {json.loads(line)["doc_id"]: line for line in first[f"{ROWS}/samples_{task}"].splitlines()}
        for line in _unmeasured(file.read_text()).splitlines():
            assert line == before[json.loads(line)["doc_id"]], (task, json.loads(line)["doc_id"])
    assert len(list((tmp_path / "again").glob("*/samples_*.jsonl"))) == 2


def test_readme_matched_budget_table_is_rendered_from_its_recorded_report():
    """The README's fill-against-drop table is `benchmarks/matched_budget.py --readme`'s rendering of the report it
    recorded (its arms: the three fills and the two droppers at one budget, within it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("matched_budget", ROOT / "benchmarks" / "matched_budget.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    report = json.loads(script.RECORD.read_text())
    text = (ROOT / "README.md").read_text()
    block = text.split(script.BEGIN, 1)[1].split(script.END, 1)[0].strip("\n") + "\n"
    assert block == script.render(report)
    budget = next(a["budget"] for a in report["arms"] if a.get("budget") is not None)
    assert {a["name"] for a in report["arms"]} == {"exact", *(f"{m}@{budget:g}" for m in
                                                   ("identity", "ridge", "nofill", "fastkv", "gemfilter"))}
    assert all(c["macs_fraction"] <= budget for a in report["arms"] if a["name"] != "exact" for c in a["cost"])
