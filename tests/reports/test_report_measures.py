"""The study report reads keytoken_nll by the paper's measures (sections 3.1, 4.7) and states its strata (3.4).

No `--metric`: key-token and novel-token ΔNLL, the novel-token perplexity gap
and KL are the columns, all-token ΔNLL only beside them; RULER by acc_filled.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from rf_eval.cli import main
from rf_eval.study.runner import report_argv

DOMAINS = ["prose", "code", "prose", "code", "prose", "code"]
REF = {"nll_all": [2.0, 2.2, 2.4, 2.6, 2.8, 3.0], "nll_novel": [3.0, 3.1, 3.2, 3.3, 3.4, 3.5],
       "nll_key": [4.0, 4.5, None, 5.0, 5.5, 6.0]}  # document 2 has no key tokens
DELTA = {"nll_all": [0.01, 0.02, 0.0, 0.01, 0.03, 0.01], "nll_novel": [0.05, 0.2, 0.1, 0.15, 0.0, 0.1],
         "nll_key": [0.3, 0.9, None, 0.6, 0.2, 1.0]}
KL = [0.01, 0.02, 0.05, 0.01, 0.3, 0.02]
MEASURES_HEADER = ("| arm | docs | key-token ΔNLL | novel-token ΔNLL | perplexity gap, novel tokens | KL(exact‖arm) "
                   "| all-token ΔNLL (secondary) | strata |")


def _docs(arm: str) -> list[dict]:
    docs = []
    for i, domain in enumerate(DOMAINS):
        d = {"domain": domain, "kl": 0.0 if arm == "exact" else KL[i]}
        for metric, values in REF.items():
            v = values[i]
            d[metric] = None if v is None else v + (0.0 if arm == "exact" else DELTA[metric][i])
        docs.append(d)
    return docs


@pytest.fixture(scope="module")
def study_out(tmp_path_factory, lmeval_format):
    """Arm folders as the study runner lays them out (arms/<name>), keytoken_nll and ruler_filled in each."""
    out = tmp_path_factory.mktemp("study")
    cells = {(t, n): [True] * 5 for t in ("niah_single_1", "niah_multikey_1") for n in (1024, 2048)}
    for k, arm in enumerate(("exact", "ridge")):
        folder = out / "arms" / arm
        lmeval_format.keytoken_run(folder, arm, _docs(arm), started=1.79e9 + k)
        if arm == "ridge":
            cells[("niah_multikey_1", 2048)] = [True, False, True, False, True]
        lmeval_format.pooled_ruler_run(folder, arm, cells, started=1.79e9 + 10 + k)
    study = SimpleNamespace(arms={"exact": None, "ridge": None}, reference="exact", margin=2.0, controls={},
                            arms_folder="arms")
    argv = report_argv(study, out, out / "no-ledger.jsonl")
    assert "--metric" not in argv  # the study's report call names no metric
    assert main([*argv, "--resamples", "2000"]) == 0
    return out


def _expected() -> dict[str, float]:
    key = [d for d in DELTA["nll_key"] if d is not None]
    novel = np.array(DELTA["nll_novel"])
    gaps = np.expm1(novel)
    per_domain = [gaps[[i for i, d in enumerate(DOMAINS) if d == name]].mean() for name in ("prose", "code")]
    return {"key": float(np.mean(key)), "novel": float(novel.mean()), "gap": float(np.mean(per_domain)),
            "kl": float(np.mean(KL)), "kl_median": float(np.median(KL)), "all": float(np.mean(DELTA["nll_all"]))}


def test_markdown_shows_key_and_novel_token_loss_gap_and_kl_with_all_token_loss_secondary(study_out):
    md = (study_out / "report.md").read_text()
    assert MEASURES_HEADER in md
    assert "### Loss on the tokens that need the prefix: keytoken_nll" in md
    assert "Losses and other measures" not in md  # all-token loss is never a table of its own
    row = re.search(r"^\| ridge \| 6 \| (.*) \|$", md, re.M).group(1).split(" | ")
    key, novel, gap, kl, all_tokens, strata = row
    e = _expected()
    assert key.startswith(f"{e['key']:+.3f} [") and key.endswith("(n=5)")  # one document has no key tokens
    assert novel.startswith(f"{e['novel']:+.3f} [")
    assert gap.startswith(f"{100 * e['gap']:+.2f}% [")
    assert kl.startswith(f"{e['kl']:.3g} [") and kl.endswith(f", median {e['kl_median']:.3g}")
    assert all_tokens.startswith(f"{e['all']:+.3f} [")
    assert strata == "domain (2 strata)"
    # each interval brackets its estimate
    for cell, value in ((key, e["key"]), (novel, e["novel"]), (all_tokens, e["all"])):
        low, high = map(float, re.search(r"\[([^,]+), ([^\]]+)\]", cell).groups())
        assert low <= value <= high
    # RULER is read by acc_filled, within RULER task and length
    assert "Metric: ruler_filled: acc_filled" in md
    assert re.search(r"^\| ruler_filled \| ridge \| 20 \| 90\.0 \| 100\.0 \| -10\.00 \| .* \| RULER task × length \(4 strata\) \|$",
                     md, re.M)


def test_html_and_latex_show_the_same_measures_and_strata(study_out):
    html = (study_out / "report.html").read_text()
    e = _expected()
    assert '<table class="measures"' in html and "<th class=\"text\">key-token ΔNLL</th>" in html
    assert f"<td class=\"text\">{e['key']:+.3f} [" in html and "all-token ΔNLL (secondary)" in html
    assert html.count("RULER task × length (4 strata)") >= 2 and "domain (2 strata)" in html
    tex = (study_out / "report.tex").read_text()
    assert r"key-token $\Delta$NLL" in tex and r"KL(exact$\|$arm)" in tex
    assert f"${e['key']:+.3f}$ [" in tex and f"{100 * e['gap']:+.2f}\\%" in tex
    assert r"RULER task $\times$ length (4 strata)" in tex and "–" not in tex and "Δ" not in tex


def test_every_format_states_the_strata_rule(study_out):
    for name in ("report.md", "report.html", "report.tex"):
        text = (study_out / name).read_text()
        assert "resampled within strata: each combination of task, RULER task, domain and length" in text, name
