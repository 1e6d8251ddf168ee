"""rf_eval.stats.summary: what a report shows, computed from synthetic lm-eval output folders."""

from __future__ import annotations

import numpy as np
import pytest

from rf_eval.stats.bootstrap import paired_bootstrap
from rf_eval.stats.runs import load_runs
from rf_eval.stats.summary import SummaryOptions, study_summary

LENGTHS = [4096, 8192, 16384]


@pytest.fixture(scope="module")
def study(tmp_path_factory, lmeval_format):
    out = tmp_path_factory.mktemp("study")
    rng = np.random.default_rng(0)
    base = {t: rng.random(60) < 0.9 for t in ("niah_single_1", "niah_multikey_1")}
    ridge = {t: np.where(rng.random(60) < 0.05, ~v, v) for t, v in base.items()}
    identity = {t: np.where(rng.random(60) < 0.4, False, v) for t, v in base.items()}
    lmeval_format.accuracy_run(out, "exact", base, lengths=LENGTHS, timings=[1.0], started=1.79e9)
    lmeval_format.accuracy_run(out, "ridge", ridge, lengths=LENGTHS, timings=[0.6], ceiling=1.8, started=1.79e9 + 1)
    lmeval_format.accuracy_run(out, "identity", identity, lengths=LENGTHS, timings=[0.6], ceiling=1.8, started=1.79e9 + 2)
    # a key-token loss task of the kind rf-eval's keytoken_nll writes: several NLL metrics, domains
    for arm, shift, start in (("exact", 0.0, 1.79e9), ("ridge", 0.02, 1.79e9 + 1)):
        lines = []
        for i in range(30):
            nll = 2.0 + 0.1 * (i % 7)
            metrics = {"nll_all": nll + shift / 4, "nll_novel": nll + shift / 2, "nll_key": nll + shift + (0.5 if i == 3 and shift else 0),
                       "kl": None}  # as keytoken_nll logs it without a same-run exact pass
            doc = {"id": i, "domain": ["prose", "code", "legal"][i % 3], "text": f"document {i}"}
            lines.append(lmeval_format.sample_line(i, doc, doc["text"], "", metrics))
        lmeval_format.write_run(out / "loss", model_args={"pretrained": "/models/tiny", "fill": arm, "split": 12},
                                tasks={"keytoken_nll": lines}, higher_is_better={"keytoken_nll": {m: False for m in metrics}},
                                started=start + 100)
    return out


def test_summary_per_task_overall_and_length(study):
    runs = load_runs([study], metrics={"keytoken_nll": ["nll_key", "nll_novel"]})
    s = study_summary(runs, "exact", SummaryOptions(margin=2.0, n_resamples=2_000))
    assert [a["name"] for a in s["arms"]] == ["exact", "ridge", "identity"]
    assert [t["task"] for t in s["tasks"]] == ["niah_single_1", "niah_multikey_1"]
    assert [r["arm"] for r in s["overall"]] == ["ridge", "identity"]
    items = runs.items
    for row in s["overall"]:  # pooled over the accuracy tasks only, each item weighing the same
        arm = items[(items.arm == row["arm"]) & (items.unit == "points")].sort_values(["task", "doc_id"])
        ref = items[(items.arm == "exact") & (items.unit == "points")].sort_values(["task", "doc_id"])
        assert row["n"] == 120
        assert row["difference"] == pytest.approx(arm.score.mean() - ref.score.mean())  # before rounding
        assert row["bound"] == min(row["lower"], row["floor"])
    identity = s["overall"][1]
    assert identity["high"] < 0 and not identity["passed"] and identity["test"]["name"] == "McNemar"
    assert s["lengths"] == LENGTHS and [r["n"] for r in s["by_length"]] == [40, 40, 40]
    assert len(s["task_length"]) == 6
    assert len(s["forest"]) == 2 * 2 + 2  # per task and pooled, for each of two arms


def test_summary_keytoken_measures_median_and_perplexity_gap(study):
    runs = load_runs([study], metrics={"keytoken_nll": ["nll_key", "nll_novel"]})
    s = study_summary(runs, "exact", SummaryOptions(n_resamples=2_000))
    assert s["losses"] == []  # keytoken_nll is read in its measures table, not the generic losses table
    (table,) = s["measures"]
    assert table["task"] == "keytoken_nll" and table["metrics"] == "nll_key, nll_novel"
    (row,) = table["rows"]
    key, novel, gap = row["cells"]["key"], row["cells"]["novel"], row["cells"]["novel_gap"]
    assert row["arm"] == "ridge" and row["n"] == key["n"] == 30
    assert row["cells"]["kl"] is None and row["cells"]["all"] is None  # not loaded
    assert key["median"] == pytest.approx(0.02) and key["difference"] == pytest.approx(0.02 + 0.5 / 30)
    assert set(gap["per_domain"]) == {"prose", "code", "legal"}
    assert gap["difference"] == pytest.approx(np.mean(list(gap["per_domain"].values())))
    assert gap["difference"] == pytest.approx(np.expm1(0.01))  # novel-token loss: +0.01 on every document
    assert gap["low"] <= gap["difference"] <= gap["high"]
    assert novel["difference"] == pytest.approx(0.01) and novel["low"] == pytest.approx(0.01)
    assert key["strata"] == novel["strata"] == "domain (3 strata)" == row["strata"]
    # losses are not pooled with accuracy, and only primary metrics enter the pooled rows
    assert all(r["n"] == 120 for r in s["overall"])


def test_summary_reads_keytoken_by_the_papers_measures_by_default(study):
    runs = load_runs([study])  # no --metric: key-token, novel-token and all-token loss (no KL recorded)
    kt = runs.items[runs.items.task == "keytoken_nll"]
    assert list(dict.fromkeys(kt.metric)) == ["nll_key", "nll_novel", "nll_all"]
    assert set(kt.loc[kt.primary.astype(bool), "metric"]) == {"nll_key"}
    assert any("no per-item values of kl" in n and "reference=exact" in n for n in runs.notes)
    (table,) = study_summary(runs, "exact", SummaryOptions(n_resamples=500))["measures"]
    assert [c["key"] for c in table["columns"]] == ["key", "novel", "novel_gap", "kl", "all"]
    assert [c["secondary"] for c in table["columns"]] == [False] * 4 + [True]
    cells = table["rows"][0]["cells"]
    assert cells["all"]["difference"] == pytest.approx(0.005) and cells["kl"] is None
    # the report's notes: the arm's missing KL is said; the reference's is no omission (no KL against itself)
    notes = study_summary(runs, "exact", SummaryOptions(n_resamples=200))["notes"]
    kl = [n for n in notes if "no per-item values of kl" in n]
    assert [n.split(":")[0] for n in kl] == ["ridge"]


def test_summary_speed_controls_and_registration(study):
    runs = load_runs([study])
    s = study_summary(runs, "exact", SummaryOptions(n_resamples=1_000, controls={"ridge": ["identity"]}), ledger=[])
    ridge = [r for r in s["speed"] if r["arm"] == "ridge"]
    assert [r["length"] for r in ridge] == LENGTHS
    for r in ridge:
        assert r["speedup"] == pytest.approx(1 / 0.6) and r["ceiling"] == 1.8
        assert r["share"] == pytest.approx(r["speedup"] / 1.8)
    (ctrl,) = s["controls"]
    pts = runs.items[runs.items.unit == "points"]
    sel = pts[pts.arm == "ridge"].sort_values(["task", "doc_id"]).score.to_numpy()
    con = pts[pts.arm == "identity"].sort_values(["task", "doc_id"]).score.to_numpy()
    assert ctrl["margin"] == pytest.approx(paired_bootstrap(sel, con).difference)
    regs = {a["name"]: a["registration"] for a in s["arms"]}
    assert regs["exact"] is None and regs["ridge"]["status"] == "not registered"
    with pytest.raises(ValueError, match="no arm named 'random'"):
        study_summary(runs, "exact", SummaryOptions(controls={"ridge": ["random"]}))


def test_summary_marks_each_comparison_registered_or_follow_up(study, tmp_path):
    from datetime import datetime, timezone

    from rf_eval.reports.render import render_latex
    from rf_eval.stats.ledger import append_entry, verify_ledger

    cfg = tmp_path / "plan.yaml"
    cfg.write_text("arms: [identity, ridge]\n")
    path = tmp_path / "ledger.jsonl"
    before, after = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc)
    append_entry(path, claim="identity loses retrieval", prediction="diff < -5", configs=[cfg], arms=["identity"], now=before)
    append_entry(path, claim="ridge within 2 points", prediction="NI bound > -2", configs=[cfg], arms=["ridge"], now=after)
    s = study_summary(load_runs([study]), "exact", SummaryOptions(n_resamples=500), ledger=verify_ledger(path))
    status = {r["arm"]: r["registration"] for r in s["overall"]}
    assert status == {"identity": "registered", "ridge": "follow-up"}
    assert {r["registration"] for t in s["tasks"] for r in t["rows"] if r["arm"] == "ridge"} == {"follow-up"}
    tex = render_latex(s)
    assert r"ridge$^\dagger$" in tex and r"identity$^\dagger$" not in tex


def test_every_arms_score_is_on_the_references_items(tmp_path, lmeval_format):
    """Issue #42, item 2: POP's one-row tail leaves needles filled that exact's tail covers; its per-length score
    is on exact's items alone (the fixed sample set), with a note where an arm scored fewer of them."""
    exact = {"niah": [True] * 20}
    pop = {"niah": [True] * 10 + [False] * 10}  # its ten more items (10..19, filled only under its own tail) fail
    lmeval_format.accuracy_run(tmp_path / "e", "exact", exact, lengths=[4096])
    lmeval_format.accuracy_run(tmp_path / "p", "pop", pop, lengths=[4096], started=1.79e9 + 1)
    short = {"niah": [True] * 5}  # an arm that scored only 5 of the reference's items
    lmeval_format.accuracy_run(tmp_path / "s", "short", short, lengths=[4096], started=1.79e9 + 2)
    runs = load_runs([tmp_path])
    keep = ~((runs.items["arm"] == "exact") & (runs.items["doc_id"] >= 10))  # exact scored items 0..9 only
    summary = study_summary(type(runs)(runs.items[keep], runs.arms, runs.notes), "exact", SummaryOptions(n_resamples=200))
    (row,) = summary["by_length"]
    assert row["n"] == 10 and row["scores"] == {"exact": 100.0, "pop": 100.0, "short": 100.0}
    assert "short: scored on 5 of the reference's 10 items (4096)" in " ".join(summary["notes"])
    assert summary["score_set"].startswith("every arm's score on exact's items")
    (cell,) = summary["task_length"]
    assert cell["scores"]["pop"] == 100.0  # not 50.0, its own twenty items' mean
