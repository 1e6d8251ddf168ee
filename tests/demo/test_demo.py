"""`rf-eval demo --quick` end to end, offline, run once per module (`quick_demo`): fit (cached), the built-in
study's five arms through lm_eval, report; the tests read that run (the real-weight guard that ridge beats
identity at one budget among them); then one arm again from scratch, whose samples must come out line for
line the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from demo_command import QUICK_DEMO
from warm_start import run_argv

from rf_eval.cost.prefill_cost import MEASURED_FIELDS
from rf_eval.demo.study import SPLIT, caption, render_study, settings
from rf_eval.demo.table import readme_block, record_path, render_table
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

    from rf_eval.cost.mac_model import layer_costs
    from rf_eval.demo.study import ridge_budget

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


def _demo(out: Path) -> subprocess.CompletedProcess:
    done = run_argv([sys.executable, "-m", "rf_eval", *QUICK_DEMO[1:], "--out", str(out)], timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "report.html").is_file() and (out / "report.md").is_file() and "report:" in done.stdout
    return done


@dataclass(frozen=True)
class QuickDemo:
    """One `rf-eval demo --quick` run, read by every test below (each reads what it checks)."""

    out: Path
    state: dict  # study.json
    summary: dict  # report.json
    budget: float  # the three fills' shared budget
    stdout: str

    def arm(self, fill: str) -> str:
        return f"{fill}@{self.budget:g}"

    def per_document(self, arm: str) -> dict[int, dict]:
        """The arm's keytoken_nll samples, by document."""
        (file,) = self.out.glob(f"runs/{arm}/*/samples_keytoken_nll_*.jsonl")
        return {row["doc_id"]: row for row in map(json.loads, file.read_text().splitlines())}


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory) -> QuickDemo:
    """The README's first command once, end to end, offline (the fit cached as the quality tests cache it)."""
    out = tmp_path_factory.mktemp("quick") / "demo"
    done = _demo(out)
    state = json.loads((out / "study.json").read_text())
    budget = next(float(a.split("@")[1]) for a in state["arms"] if a.startswith("ridge@"))
    return QuickDemo(out, state, json.loads((out / "report.json").read_text()), budget, done.stdout)


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(quick_demo):
    out, state = quick_demo.out, quick_demo.state
    assert len(_samples(out)) == 5 * 2  # 5 arms x (needle task, keytoken_nll)
    (reference,) = out.glob("runs/exact/*/samples_keytoken_nll_*.jsonl")
    for arm in (*map(quick_demo.arm, ("identity", "ridge", "nofill")), ROWS):  # key tokens from exact
        command = state["arms"][arm]["command"]
        assert json.loads(command[command.index("--metadata") + 1])["key_reference"] == str(reference)
    # the exact arm reads the context: >= 90% on the filled-region samples
    (exact,) = out.glob("runs/exact/*/samples_niah*.jsonl")
    filled = [r for r in map(json.loads, exact.read_text().splitlines()) if r.get("filled") == 1]
    assert filled, "no needle fell in the filled region"
    assert sum(r["acc_filled"] for r in filled) / len(filled) >= 0.9
    html = (out / "report.html").read_text()
    assert "identity" in html and "ridge,selector=attention" in html
    # the arms run in this process: each reference=exact arm read the exact arm's rows of the 12 documents
    # back (rf_eval.engine.shared_rows) instead of computing them again, and the later filled arms the lower layers
    # identity@ ran (rf_eval.engine.shared_lower; where the rows arm's selector captures lower-layer inputs,
    # it runs its own); the determinism test below computes both itself
    assert ("read back from an earlier arm instead of computed again: the stock model's rows of 48 prompts, the "
            "lower layers of 33") in quick_demo.stdout


#: ridge's KL and novel-token ΔNLL must be below identity's divided by this, and its key-token ΔNLL likewise
#: (issue #23; measured at the quick demo's budget: 5.7x, 4.9x and 2.6x, on 94 key tokens in 12 documents)
RIDGE_FACTOR = 2.0


@pytest.mark.slow
def test_at_one_budget_ridge_beats_identity_and_identity_beats_nofill(quick_demo):
    """What a newcomer sees (issue #23), at one cost (issue #38), on real weights: at the budget they share, the
    fitted map keeps at least identity's needles and has under half its KL, novel-token and key-token loss;
    the compute spent on a longer tail instead (nofill) loses more than either fill. This is the guard that
    fails when a default makes the fitted map worse than the identity fill."""
    summary, budget = quick_demo.summary, quick_demo.budget
    assert next(a["budget"] for a in summary["arms"] if a["name"].startswith("ridge@")) == budget
    ridge, identity, nofill = map(quick_demo.arm, ("ridge", "identity", "nofill"))
    needles = {row["arm"]: row["arm_score"] * row["n"] / 100 for row in summary["overall"]}
    (keytoken,) = [m for m in summary["measures"] if m["task"] == "keytoken_nll"]
    for measure in ("key", "novel", "kl"):
        loss = {row["arm"]: row["cells"][measure]["difference"] for row in keytoken["rows"]}
        assert loss[ridge] < loss[identity] / RIDGE_FACTOR, (measure, loss)
        assert loss[nofill] > loss[identity], (measure, loss)
    key = {row["arm"]: row["cells"]["key"]["difference"] for row in keytoken["rows"]}
    assert needles[ridge] >= needles[identity], needles
    assert key[ROWS] < key[ridge], key  # the rows buy a lower loss (for more compute: the cost test)
    assert sum(row["n_key"] for row in quick_demo.per_document("exact").values()) >= 10  # enough key tokens


def _paired_lower_bound(worse: dict[int, dict], better: dict[int, dict], measure: str) -> float:
    """The 95% percentile-bootstrap lower bound of the mean per-document difference worse - better (scipy's
    bootstrap, paired by document, fixed seed), over the documents that have the measure."""
    import numpy as np
    from scipy.stats import bootstrap

    docs = [d for d in sorted(worse) if worse[d][measure] is not None]
    assert docs and all(better[d][measure] is not None for d in docs), measure  # one key-token set for both
    diffs = np.array([worse[d][measure] - better[d][measure] for d in docs])
    result = bootstrap((diffs,), np.mean, confidence_level=0.95, n_resamples=10_000, method="percentile",
                       random_state=np.random.default_rng(0))
    return float(result.confidence_interval.low)


@pytest.mark.slow
def test_ridge_beats_identity_with_a_paired_interval_above_zero(quick_demo):
    """The factor test compares point estimates (the full demo's ridge interval against exact includes zero);
    this one asks the paired question directly: over the report documents, identity's loss minus ridge's at
    the shared budget has a 95% bootstrap interval wholly above zero, per measure (measured: key-token
    +0.222, novel-token +0.066, KL +0.075)."""
    identity, ridge = (quick_demo.per_document(quick_demo.arm(fill)) for fill in ("identity", "ridge"))
    assert identity.keys() == ridge.keys() and len(identity) == 12
    for measure in ("dnll_key", "dnll_novel", "kl"):
        low = _paired_lower_bound(identity, ridge, measure)
        print(f"identity - ridge, {measure}: 95% lower bound {low:+.4f}")
        assert low > 0, (measure, low)


@pytest.mark.slow
def test_the_fills_spend_one_budget_and_the_report_compares_them(quick_demo):
    """The cost half: the three fills spent the same budget, within one tail row of it; the attention rows cost
    more; the report draws the frontier and compares the arms of the one budget."""
    summary, budget = quick_demo.summary, quick_demo.budget
    costs = {a["name"]: {c["length"]: c for c in a["cost"]} for a in summary["arms"]}
    fills = [quick_demo.arm(fill) for fill in ("ridge", "identity", "nofill")]
    for arm in fills:
        assert all(budget - 0.01 < c["macs_fraction"] <= budget for c in costs[arm].values()), costs[arm]
    assert all(c["macs_fraction"] > budget for c in costs[ROWS].values())
    html = (quick_demo.out / "report.html").read_text()
    assert "Quality-cost frontier" in html and html.count('class="frontier-chart"') == 2
    (matched,) = summary["budgets"]
    assert matched["budget"] == budget and {a["arm"] for a in matched["arms"]} == set(fills)


@pytest.mark.slow
def test_the_readme_quick_demo_table_is_this_runs(quick_demo):
    table = (quick_demo.out / "demo_table.md").read_text()
    assert readme_block((ROOT / "README.md").read_text(), quick=True) == table, (
        "README.md's quick demo table differs from what the demo produced; run "
        "`rf-eval demo --quick --readme README.md` and commit the result:\n" + table)


@pytest.mark.slow
def test_one_arm_again_from_scratch_gives_the_same_samples(quick_demo, tmp_path):
    """Determinism: the rows arm (map, selector and the shared key tokens) again, its own lm_eval command on a
    needle sample and two documents, from scratch (another output folder, no request cache, its exact
    reference computed in its own process instead of read back from the exact arm's): the samples are the
    first run's, line for line, but for the measured prefill seconds."""
    first = _samples(quick_demo.out)
    command = list(quick_demo.state["arms"][ROWS]["command"])
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
