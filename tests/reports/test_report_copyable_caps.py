"""Issue #42, item 6: keytoken_nll by copyable share (`--strata copyable`, paper section 4.7, Table 13) and
each arm's length-cap hits beside the reference's (sections 4.5, 4.6), in every format the report writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from rf_eval.cli import main

# Per document: its domain, the reference's copyable share (on and between the default cut points 0.1, 0.5),
# the reference's losses and the ridge arm's differences (nats) and KL.
DOMAINS = ["prose", "code", "prose", "code", "prose", "code", "prose", "code"]
SHARES = [0.0, 0.05, 0.1, 0.3, 0.5, 0.7, 1.0, 0.45]
REF = {"nll_all": [2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7], "nll_novel": [3.0, 3.1, 3.2, 3.3, 3.4, 3.5, 3.6, 3.7],
       "nll_key": [4.0, 4.5, None, 5.0, 5.5, 6.0, 6.5, 7.0]}  # document 2 has no key tokens
DELTA = {"nll_all": [0.01, 0.03, 0.02, 0.05, -0.2, -0.4, -1.5, 0.04],
         "nll_novel": [0.05, 0.15, 0.1, 0.2, -0.1, -0.3, -1.0, 0.12],
         "nll_key": [0.3, 0.5, None, 0.9, -0.5, -0.8, -3.0, 0.7]}
KL = [0.01, 0.02, 0.03, 0.05, 0.4, 0.9, 2.5, 0.04]
#: where the module docstring of rf_eval.stats.copyable puts each document (a share on a cut point: the bin
#: above; a share of 1 in the last, closed bin)
DEFAULT_BINS = {"[0, 0.1)": [0, 1], "[0.1, 0.5)": [2, 3, 7], "[0.5, 1]": [4, 5, 6]}


def _docs(arm: str) -> list[dict]:
    docs = []
    for i, domain in enumerate(DOMAINS):
        # ridge logs another share for document 0: a document's bin is the reference's share of it
        d = {"domain": domain, "kl": 0.0 if arm == "exact" else KL[i],
             "copyable_share": 0.95 if (arm == "ridge" and i == 0) else SHARES[i]}
        for metric, values in REF.items():
            v = values[i]
            d[metric] = None if v is None else v + (0.0 if arm == "exact" else DELTA[metric][i])
        docs.append(d)
    return docs


def _report(out, *extra: str) -> int:
    return main(["report", str(out / "exact"), str(out / "ridge"), "--reference", "exact", "--resamples", "300",
                 "--html", str(out / "r.html"), "--markdown", str(out / "r.md"), "--latex", str(out / "r.tex"),
                 "--json", str(out / "r.json"), "--overwrite", *extra])


@pytest.fixture(scope="module")
def keytoken_out(tmp_path_factory, lmeval_format):
    out = tmp_path_factory.mktemp("copyable")
    for k, arm in enumerate(("exact", "ridge")):
        lmeval_format.keytoken_run(out / arm, arm, _docs(arm), started=1.79e9 + k)
    assert _report(out, "--strata", "copyable") == 0
    return out


def _bins(out) -> dict:
    (table,) = json.loads((out / "r.json").read_text())["copyable"]["tables"]
    return {b["bin"]: b for b in table["bins"]}


def _mean(values: list) -> float:
    return float(np.mean([v for v in values if v is not None]))


def test_each_bin_holds_the_paired_differences_of_its_documents(keytoken_out):
    bins = _bins(keytoken_out)
    assert list(bins) == list(DEFAULT_BINS)
    for label, docs in DEFAULT_BINS.items():
        b = bins[label]
        assert b["docs"] == len(docs)
        (row,) = b["rows"]
        assert row["arm"] == "ridge" and row["n"] == len(docs)
        cells = row["cells"]
        for key, metric in (("key", "nll_key"), ("novel", "nll_novel"), ("all", "nll_all")):
            expected = _mean([DELTA[metric][i] for i in docs])
            assert cells[key]["difference"] == pytest.approx(expected, abs=1e-12), (label, key)
            assert cells[key]["n"] == len([i for i in docs if DELTA[metric][i] is not None])
            assert cells[key]["low"] - 1e-12 <= expected <= cells[key]["high"] + 1e-12
        assert cells["kl"]["difference"] == pytest.approx(_mean([KL[i] for i in docs]), abs=1e-12)
        gaps = {d: np.mean([np.expm1(DELTA["nll_novel"][i]) for i in docs if DOMAINS[i] == d])
                for d in {DOMAINS[i] for i in docs}}
        assert cells["novel_gap"]["difference"] == pytest.approx(np.mean(list(gaps.values())), abs=1e-12)


def test_the_bin_is_a_stratum_of_every_keytoken_comparison(keytoken_out):
    summary = json.loads((keytoken_out / "r.json").read_text())
    (measures,) = summary["measures"]
    (row,) = measures["rows"]
    assert row["strata"] == "domain × copyable share (6 strata)"  # 2 domains × 3 bins, all non-empty
    assert row["cells"]["novel"]["difference"] == pytest.approx(np.mean(DELTA["nll_novel"]), abs=1e-12)
    assert "copyable-share bin, with --strata copyable" in summary["strata_rule"]
    # within a bin the bin splits nothing: only the domains are named
    assert {r["strata"] for b in _bins(keytoken_out).values() for r in b["rows"]} == {"domain (2 strata)"}


def test_every_format_carries_the_copyable_tables(keytoken_out):
    key = {label: _mean([DELTA["nll_key"][i] for i in docs]) for label, docs in DEFAULT_BINS.items()}
    md = (keytoken_out / "r.md").read_text()
    assert "### Loss on the tokens that need the prefix by copyable share: keytoken_nll" in md
    for label, docs in DEFAULT_BINS.items():
        assert re.search(rf"^\| {re.escape(label)} \| {len(docs)} \| ridge \| {len(docs)} \| "
                         + re.escape(f"{key[label]:+.3f} ["), md, re.M), label
    html = (keytoken_out / "r.html").read_text()
    assert 'id="copyable-1"' in html and "by copyable share: keytoken_nll" in html
    for label in DEFAULT_BINS:
        assert f'<td class="text">{label}</td>' in html
        assert f'<td class="text">{key[label]:+.3f} [' in html
    tex = (keytoken_out / "r.tex").read_text()
    assert "by copyable share: keytoken\\_nll" in tex
    for label in DEFAULT_BINS:
        assert "{" + label + "} & " in tex  # braced: a row starting with [ is not read as \\[<length>]
        assert f"${key[label]:+.3f}$ [" in tex
    assert tex.count(r"\caption{") == tex.count("Metric: ")
    pdflatex = shutil.which("pdflatex")
    assert pdflatex, "pdflatex is required for this test (README command 1 installs it: .ci/system-packages)"
    (keytoken_out / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n"
                                            "\\begin{document}\n\\input{r.tex}\n\\end{document}\n")
    run = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=keytoken_out,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]


def test_copyable_bins_sets_the_cut_points(keytoken_out):
    assert _report(keytoken_out, "--strata", "copyable", "--copyable-bins", "0.3,0.7") == 0
    bins = _bins(keytoken_out)
    # 0.3 and 0.7 lie on cut points: the bin above
    expected = {"[0, 0.3)": [0, 1, 2], "[0.3, 0.7)": [3, 4, 7], "[0.7, 1]": [5, 6]}
    assert {label: b["docs"] for label, b in bins.items()} == {label: len(d) for label, d in expected.items()}
    for label, docs in expected.items():
        (row,) = bins[label]["rows"]
        assert row["cells"]["all"]["difference"] == pytest.approx(_mean([DELTA["nll_all"][i] for i in docs]))
    assert "--copyable-bins 0.3,0.7" in (keytoken_out / "r.md").read_text()
    # without --strata copyable, no bins and no copyable stratum
    assert _report(keytoken_out) == 0
    summary = json.loads((keytoken_out / "r.json").read_text())
    assert summary["copyable"] is None and summary["measures"][0]["rows"][0]["strata"] == "domain (2 strata)"
    assert "by copyable share" not in (keytoken_out / "r.md").read_text()


# ---- length-cap hits (sections 4.5, 4.6)

LENGTHS = (16384, 32768)
#: per length, (ridge's cap hits, exact's) over 20 filled samples each
CAPS = {16384: (12, 8), 32768: (7, 4)}


def _cwe_run(fmt, out, arm: str, started: float):
    """A ruler_cwe_filled run whose samples log `cap_hits`; sample 20 of each length is excluded (its needle in
    the tail, acc_filled None) and hits the cap in both arms: it is not one of the compared items."""
    lines = []
    for length in LENGTHS:
        hits = CAPS[length][0 if arm == "ridge" else 1]
        for i in range(21):
            filled = i < 20
            doc = {"index": i, "input": f"words {length} {i}", "outputs": ["a b c"], "max_length": length}
            metrics = {"acc_filled": float(i % 2) if filled else None, "acc_all": float(i % 2)}
            cap = int(i < hits) if filled else 1
            lines.append(fmt.sample_line(len(lines), doc, doc["input"], "a b c", metrics, extra={"cap_hits": cap}))
    return fmt.write_run(out, model_args={"pretrained": "/models/tiny", "fill": arm, "split": 12},
                         tasks={"ruler_cwe_filled": lines}, started=started)


def test_cap_hits_per_arm_beside_the_reference_in_every_format(tmp_path, lmeval_format):
    _cwe_run(lmeval_format, tmp_path / "exact", "exact", 1.79e9)
    _cwe_run(lmeval_format, tmp_path / "ridge", "ridge", 1.8e9)
    assert _report(tmp_path) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["cap_hits"]["rows"]
    hits = [sum(c[i] for c in CAPS.values()) for i in (0, 1)]
    assert [(r["task"], r["length"], r["arm"], r["n"], r["arm_hits"], r["ref_hits"]) for r in rows] == [
        *[("ruler_cwe_filled", n, "ridge", 20, *CAPS[n]) for n in LENGTHS],
        ("ruler_cwe_filled", "all", "ridge", 40, *hits),
        # every item, as section 4.5 counts (#55 item 7): the two excluded samples hit the cap in both arms
        ("ruler_cwe_filled", "every item", "ridge", 42, hits[0] + 2, hits[1] + 2)]
    md = (tmp_path / "r.md").read_text()
    assert "### Length-cap hits" in md and "| task | length | arm | n | cap hits | exact |" in md
    for n in LENGTHS:
        assert f"| ruler_cwe_filled | {n:,} | ridge | 20 | {CAPS[n][0]} | {CAPS[n][1]} |" in md
    html = (tmp_path / "r.html").read_text()
    assert 'id="cap-hits"' in html
    assert f"<td>{LENGTHS[0]:,}</td><td class=\"text\">ridge</td><td>20</td><td>12</td><td>8</td>" in html
    tex = (tmp_path / "r.tex").read_text()
    assert "Length-cap hits" in tex and f"ruler\\_cwe\\_filled & {LENGTHS[1]:,} & ridge & 20 & 7 & 4 \\\\" in tex
    assert f"| ruler_cwe_filled | every item | ridge | 42 | {hits[0] + 2} | {hits[1] + 2} |" in md
    assert "<td>every item</td><td class=\"text\">ridge</td><td>42</td>" in html and "every item & ridge & 42" in tex


def test_no_cap_table_without_cap_flags(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path / "exact", "exact", {"t": [True, False, True]})
    lmeval_format.accuracy_run(tmp_path / "ridge", "ridge", {"t": [True, True, True]}, started=1.8e9)
    assert _report(tmp_path) == 0
    assert json.loads((tmp_path / "r.json").read_text())["cap_hits"]["rows"] == []
    assert "Length-cap hits" not in (tmp_path / "r.md").read_text()
    assert 'id="cap-hits"' not in (tmp_path / "r.html").read_text()
