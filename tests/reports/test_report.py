"""`rf-eval report` end to end: lm-eval's own output in, HTML checked in headless Chromium, LaTeX compiled."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from rf_eval.cli import main
from rf_eval.stats.ledger import append_entry

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is required for this test (README command 1 installs it: .ci/system-packages)"
    return path


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [_tool("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(lmeval_runs, tmp_path_factory):
    exact, ridge = lmeval_runs
    out = tmp_path_factory.mktemp("report")
    cfg = out / "ridge-arm.yaml"
    cfg.write_text("model: dummy\nmodel_args: arm=ridge\n")
    ledger = out / "ledger.jsonl"
    append_entry(ledger, claim="ridge within 2 points of exact", prediction="NI bound > -2",
                 configs=[cfg], arms=["ridge"], now=datetime.now(timezone.utc) - timedelta(days=1))
    code = main([
        "report", str(exact), str(ridge), "--reference", "exact", "--ledger", str(ledger),
        "--html", str(out / "report.html"), "--latex", str(out / "report.tex"), "--latex-standalone",
        "--markdown", str(out / "report.md"),
    ])  # fmt: skip
    assert code == 0
    return out


def test_report_names_arms_from_model_args_and_pairs_items(report):
    md = (report / "report.md").read_text()
    assert "| exact (reference) | `arm=exact` | 36 | – |" in md
    assert "| ridge | `arm=ridge` | 36 | – | registered |" in md  # no cost recorded: a dash
    assert re.search(r"\| ridge \| 36 \| .* \| registered \|\n", md)  # the pooled comparison, too
    assert re.search(r"\| rfe_mc \| ridge \| 24 \|", md)
    assert re.search(r"\| rfe_ruler \| ridge \| 12 \| [\d.]+ \| [\d.]+ \| \+0\.00 \|", md)  # same answers both arms
    for length in ("256", "512", "1024"):
        assert f"\n| {length} | 12 |" in md


def test_html_is_self_contained(report):
    html = (report / "report.html").read_text()
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"(src|href)\s*=", html) and "url(" not in html and "@import" not in html
    assert set(re.findall(r"https?://[^\s\"']+", html)) <= {"http://www.w3.org/2000/svg"}  # a namespace, never fetched


def test_html_loads_in_chromium_without_console_messages_and_draws_the_forest_plot(report, tmp_path):
    url = (report / "report.html").as_uri()
    dom = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []
    forest = re.search(r'<svg id="forest-plot".*?</svg>', dom.stdout, re.S)
    assert forest, "no forest plot in the rendered DOM"
    svg = forest.group(0)
    # one contrast per task plus the pooled one, each an interval line and an estimate
    assert svg.count('<g class="contrast">') == 3
    assert svg.count('class="interval"') == 3 and svg.count('class="estimate"') == 3
    assert 'class="zero"' in svg and 'class="margin"' in svg
    assert '<svg id="length-chart"' in dom.stdout and dom.stdout.count('<g class="series">') == 2
    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1800", url)
    assert run.returncode == 0, run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_console_check_catches_errors(tmp_path):
    """The check above would see a script error (it is not vacuous)."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    run = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert any(":CONSOLE" in line and "Uncaught" in line for line in run.stderr.splitlines())


def test_latex_compiles_with_pdflatex(report, tmp_path):
    tex = (report / "report.tex").read_text()
    assert r"\usepackage{booktabs}" in tex and r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert re.search(r"\[\$[+-]\d+\.\d\d\$, \$[+-]\d+\.\d\d\$\]", tex)  # intervals as [lo, hi]
    run = subprocess.run(
        [_tool("pdflatex"), "-interaction=nonstopmode", "-halt-on-error", f"-output-directory={tmp_path}", str(report / "report.tex")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    assert (tmp_path / "report.pdf").stat().st_size > 1000


def test_report_refuses_items_whose_prompts_differ(tmp_path, lmeval_format, capsys):
    outcomes = {"niah_single_1": [True, False, True]}
    lmeval_format.accuracy_run(tmp_path / "a", "exact", outcomes)
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", outcomes, started=1.8e9, prompt_suffix=" (chat)")
    code = main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--reference", "exact", "--html", str(tmp_path / "r.html")])
    assert code == 2
    err = capsys.readouterr().err
    assert "task 'niah_single_1', doc 0: the prompts differ" in err
    assert not (tmp_path / "r.html").exists()


def test_report_user_errors(tmp_path, lmeval_format, capsys):
    lmeval_format.accuracy_run(tmp_path, "exact", {"t": [True]})
    html = str(tmp_path / "r.html")
    assert main(["report", str(tmp_path), "--reference", "nope", "--html", html]) == 2
    assert "the runs given hold one arm (tiny)" in capsys.readouterr().err  # said before the unknown reference
    assert main(["report", str(tmp_path / "missing"), "--reference", "x", "--html", html]) == 2
    assert main(["report", str(tmp_path), "--reference", "tiny", "--html", html, "--control", "bad"]) == 2
    assert main(["report", str(tmp_path), "--reference", "tiny", "--html", html, "--ledger", str(tmp_path / "no.jsonl")]) == 2
