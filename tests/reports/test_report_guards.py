"""`rf-eval report` never prints a silently wrong report (issue #15, cases 1, 2, 6; LaTeX fragment)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rf_eval.cli import main
from rf_eval.stats.ledger import append_entry, ledger_head


def filled_run(fmt, out: Path, arm: str, outcomes: list[bool], *, filled: bool, started: float = 1.79e9) -> Path:
    """A `niah_single_1_filled` run as the task logs it: acc_filled None on samples whose needle is in the tail."""
    lines = []
    for i, ok in enumerate(outcomes):
        doc = {"index": i, "input": f"haystack {i}", "outputs": [str(1000 + i)], "max_length": 512}
        score = 1.0 if ok else 0.0
        metrics = {"acc_filled": score if filled else None, "acc_all": score, "n_filled": int(filled),
                   "n_excluded": int(not filled), "filled": int(filled), "needle_rows_from_end": 40 + i}
        lines.append(fmt.sample_line(i, doc, f"haystack {i}\nWhat is the number?", doc["outputs"][0], metrics))
    path = fmt.write_run(out, model_args={"pretrained": "/models/tiny", "fill": arm, "split": 12},
                         tasks={"niah_single_1_filled": lines}, started=started)
    data = json.loads(path.read_text())
    data["configs"]["niah_single_1_filled"]["metadata"]["tail"] = 4096
    path.write_text(json.dumps(data))
    return path


def _report(tmp_path, *runs, extra=()) -> int:
    return main(["report", *map(str, runs), "--reference", "exact", "--html", str(tmp_path / "r.html"),
                 "--markdown", str(tmp_path / "r.md"), "--resamples", "200", *extra])


def test_no_filled_item_stops_the_report_naming_tail_and_lengths(tmp_path, lmeval_format, capsys):
    """Case 1: the old code fell back to acc_all and printed a non-inferiority verdict, exit 0."""
    filled_run(lmeval_format, tmp_path / "a", "exact", [True, False, True, True], filled=False)
    filled_run(lmeval_format, tmp_path / "b", "ridge", [True, True, False, True], filled=False, started=1.8e9)
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b") == 2
    err = capsys.readouterr().err
    assert "primary metric 'acc_filled' has no value on any item" in err
    assert "tail 4096" in err and "lengths 512" in err and "--allow-empty" in err
    assert not (tmp_path / "r.html").exists()
    # --allow-empty leaves the task out; with nothing else to compare, the report still refuses
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--allow-empty"]) == 2
    assert "no per-item results" in capsys.readouterr().err


def test_allow_empty_leaves_the_task_out_and_reports_the_rest(tmp_path, lmeval_format, capsys):
    for name, arm, started in (("a", "exact", 1.79e9), ("b", "ridge", 1.8e9)):
        filled_run(lmeval_format, tmp_path / name / "f", arm, [True, False], filled=False, started=started)
        lmeval_format.accuracy_run(tmp_path / name / "m", arm, {"mc": [True, False, True]}, started=started + 1)
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--allow-empty"]) == 0
    out = capsys.readouterr().out
    assert "niah_single_1_filled left out (--allow-empty)" in out
    md = (tmp_path / "r.md").read_text()
    assert "Metric: niah_single_1_filled" not in md  # never reported under a fallback metric
    assert md.count("Metric: mc: acc") >= 2  # every table's caption names its metric
    assert "niah_single_1_filled |" not in md


def test_every_table_caption_names_the_metric(tmp_path, lmeval_format):
    filled_run(lmeval_format, tmp_path / "a", "exact", [True, False, True], filled=True)
    filled_run(lmeval_format, tmp_path / "b", "ridge", [True, True, True], filled=True, started=1.8e9)
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--latex", str(tmp_path / "t.tex")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert html.count("<caption>Metric: niah_single_1_filled: acc_filled</caption>") >= 3
    tex = (tmp_path / "t.tex").read_text()
    assert tex.count(r"\caption{") == tex.count(r"Metric: niah\_single\_1\_filled: acc\_filled")


def _with_ledger_head(results: Path, ledger: Path) -> None:
    data = json.loads(results.read_text())
    head = ledger_head(ledger)
    data["config"]["rf_eval"] = {"ledger": {"path": str(ledger), "hash": head.hash, "count": head.count}}
    results.write_text(json.dumps(data))


def test_report_checks_the_heads_runs_recorded_and_records_its_own(tmp_path, lmeval_format, capsys):
    """Case 2: deleting the ledger's last entries is caught by the head a run recorded."""
    cfg = tmp_path / "plan.yaml"
    cfg.write_text("arms: [ridge]\n")
    ledger = tmp_path / "ledger.jsonl"
    append_entry(ledger, claim="c0", prediction="p0", configs=[cfg], arms=["ridge"])
    append_entry(ledger, claim="c1", prediction="p1", configs=[cfg], arms=["ridge"])
    a = lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True]})
    b = lmeval_format.accuracy_run(tmp_path / "b", "ridge", {"t": [True, True, True]}, started=1.8e9)
    _with_ledger_head(b, ledger)
    assert _report(tmp_path, a, b, extra=["--ledger", str(ledger), "--latex", str(tmp_path / "t.tex")]) == 0
    head = ledger_head(ledger)
    assert head.count == 3  # the two claims and the results entry the report added for the files it read
    assert f"{head.hash}:3" in (tmp_path / "r.md").read_text()
    assert f"{head.hash}:3" in (tmp_path / "r.html").read_text() and head.hash in (tmp_path / "t.tex").read_text()
    ledger.write_text(ledger.read_text().splitlines(keepends=True)[0])  # the last entry deleted
    assert main(["ledger", "verify", "--ledger", str(ledger)]) == 0  # the chain alone looks intact...
    capsys.readouterr()
    assert _report(tmp_path, a, b, extra=["--ledger", str(ledger)]) == 2  # ...the recorded head does not
    err = capsys.readouterr().err
    assert "arm ridge" in err and "recorded ledger head" in err and "fewer than the 2" in err


def test_latex_is_a_fragment_a_paper_inputs(tmp_path, lmeval_format):
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True]})
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", {"t": [True, True, True]}, started=1.8e9)
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b", extra=["--latex", str(tmp_path / "tables.tex")]) == 0
    fragment = (tmp_path / "tables.tex").read_text()
    assert r"\documentclass" not in fragment and r"\begin{document}" not in fragment and r"\toprule" in fragment
    assert _report(tmp_path, tmp_path / "a", tmp_path / "b",
                   extra=["--latex", str(tmp_path / "whole.tex"), "--latex-standalone"]) == 0
    whole = (tmp_path / "whole.tex").read_text()
    assert r"\documentclass{article}" in whole and whole.rstrip().endswith(r"\end{document}")
    paper = tmp_path / "paper.tex"
    paper.write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                     "\\input{tables.tex}\n\\end{document}\n")
    import shutil

    pdflatex = shutil.which("pdflatex")
    assert pdflatex, "pdflatex is required for this test (README command 1 installs it: .ci/system-packages)"
    run = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]


# (report arguments after the run folders, the runs ({a}, {b}: two arms of task t; {c}: another task;
#  {f1}, {f2}: two arms of a filled task with no filled item; {w}, {w2}: arm ridge on other weights,
#  fingerprinted; {p}: on another pretrained; {n}: with another parameter count; {g}: other generation
#  settings; {v}: another task version; {m}: another metric list; {t}: other targets; {x}: exact's run of
#  another task on other weights; {k1}, {k2}: two arms of keytoken_nll that logged no copyable share),
#  message fragment, exit code)
BAD_REPORT = [
    (["{tmp}/missing"], [], "no such folder or lm-eval results file", 2),
    (["{tmp}/empty"], [], "no lm-eval results_*.json found", 2),
    (["{a}", "{b}"], ["--reference", "nope"], "no arm named 'nope'; the arms are: exact, ridge", 2),
    (["{a}"], ["--reference", "tiny"], "a report compares arms, and the runs given hold one arm (tiny)", 2),
    (["{b}"], [], "a report compares arms, and the runs given hold one arm (tiny)", 2),  # not "no arm named 'exact'"
    (["{a}", "{c}"], [], "the arms ran different tasks or documents (exact: t; ridge: other)", 2),
    (["{f1}", "{f2}"], [], "the primary metric 'acc_filled' has no value on any item (no item is filled", 2),
    (["{a}", "{b}"], ["--latex-standalone"], "--latex-standalone needs --latex FILE", 2),
    (["{a}", "{b}"], ["--metric", "t"], "--metric 't': expected NAME=VALUE", 2),
    (["{a}", "{b}"], ["--metric", "t=nope"], "no per-item values of metric 'nope'", 2),
    (["{a}", "{b}"], ["--metric", "keytoken_nll=kl"], "--metric names task(s) 'keytoken_nll' that no run has; "
                                                      "the runs' tasks: t", 2),
    (["{a}", "{b}"], ["--margin", "-1"], "argument --margin: '-1' must be a number >= 0", 2),
    (["{a}", "{b}"], ["--ledger", "{tmp}/none.jsonl"], "no ledger at", 2),
    (["{a}", "{b}"], ["--control", "ridge=ghost"], "no arm named 'ghost' (in --control)", 2),
    (["{a}", "{b}"], ["--ttft", "{tmp}/a.txt"], "a.txt: not an `rf-eval ttft` result (not JSON", 2),
    (["{a}", "{b}"], ["--ttft", "{tmp}/none.json"], "none.json: cannot read it", 2),
    (["{a}", "{b}"], ["--markdown", "{tmp}/r.html"], "--html and --markdown both name", 2),
    (["{a}", "{b}"], ["--latex", "{tmp}/t.tex", "--json", "{tmp}/t.tex"], "--latex and --json both name", 2),
    (["{w}", "{w2}"], [], "arm 'ridge' cannot be paired with the reference 'exact': weights fingerprint 222222222222", 2),
    (["{a}", "{p}"], [], "model (pretrained) '/models/tuned' vs '/models/tiny'", 2),
    (["{a}", "{n}"], [], "number of parameters 2000 vs 1000", 2),
    (["{a}", "{g}"], [], "task t: generation_kwargs {'max_gen_toks': 64} vs None", 2),
    (["{a}", "{v}"], [], "task t: version 2.0 vs 1.0", 2),
    (["{a}", "{m}"], [], "task t: metric_list", 2),
    (["{a}", "{t}"], [], "the targets differ between arm 'ridge' and reference 'exact'", 2),
    (["{w}", "{x}", "{w2}"], [], "arm exact: its runs were made on different weights with the same model_args", 2),
    (["{a}", "{p}"], ["--cross-model", "--reference", "nope"], "no arm named 'nope'", 2),
    (["{a}", "{b}"], ["--strata", "copyable"], "--strata copyable: no arm ran keytoken_nll", 2),
    (["{k1}", "{k2}"], ["--strata", "copyable"], "no keytoken_nll document recorded copyable_share", 2),
    (["{a}", "{b}"], ["--strata", "nope"], "argument --strata: invalid choice: 'nope'", 2),
    (["{a}", "{b}"], ["--copyable-bins", "0.2"], "--copyable-bins needs --strata copyable", 2),
    (["{a}", "{b}"], ["--strata", "copyable", "--copyable-bins", "0.1,1.5"], "1.5 is not strictly between 0 and 1", 2),
    (["{a}", "{b}"], ["--strata", "copyable", "--copyable-bins", "0,0.5"], "0 is not strictly between 0 and 1", 2),
    (["{a}", "{b}"], ["--strata", "copyable", "--copyable-bins", "0.5,0.1"], "0.5,0.1 is not increasing", 2),
    (["{a}", "{b}"], ["--strata", "copyable", "--copyable-bins", "0.1,x"], "'x' is not a number", 2),
    (["{a}", "{b}"], ["--strata", "copyable", "--copyable-bins", "nan"], "nan is not strictly between 0 and 1", 2),
]  # fmt: skip


def _other_runs(fmt, tmp_path: Path) -> None:
    """The runs of BAD_REPORT that differ from the reference {a} in what pairing must not ignore."""
    later = {"started": 1.8e9}
    for folder, arm, weights, started in (("w", "exact", "1" * 64, 1.79e9), ("w2", "ridge", "2" * 64, 1.8e9),
                                          ("x", "exact", "3" * 64, 1.81e9)):
        fmt.accuracy_run(tmp_path / folder, arm, {"t2" if folder == "x" else "t": [True, False, True]}, started=started,
                         config_extra={"rf_eval": {"weights_sha256": weights}})
    fmt.accuracy_run(tmp_path / "p", "ridge", {"t": [True, True, True]}, model_args={"pretrained": "/models/tuned"},
                     **later)
    fmt.accuracy_run(tmp_path / "n", "ridge", {"t": [True, True, True]}, config_extra={"model_num_parameters": 2000},
                     **later)
    fmt.accuracy_run(tmp_path / "g", "ridge", {"t": [True, True, True]},
                     task_extra={"generation_kwargs": {"max_gen_toks": 64}}, **later)
    fmt.accuracy_run(tmp_path / "v", "ridge", {"t": [True, True, True]}, version=2.0, **later)
    fmt.accuracy_run(tmp_path / "m", "ridge", {"t": [True, True, True]},
                     task_extra={"metric_list": [{"metric": "acc", "aggregation": "median"}]}, **later)
    fmt.accuracy_run(tmp_path / "t", "ridge", {"t": [True, True, True]}, target_suffix="0", **later)
    for folder, arm, started in (("k1", "exact", 1.79e9), ("k2", "ridge", 1.8e9)):  # no copyable_share logged
        fmt.keytoken_run(tmp_path / folder, arm, [{"nll_all": 2.0, "nll_novel": 3.0}], started=started)


@pytest.mark.parametrize("runs, extra, message, code", BAD_REPORT)
def test_report_bad_inputs(tmp_path, lmeval_format, capsys, runs, extra, message, code):
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True]})
    lmeval_format.accuracy_run(tmp_path / "b", "ridge", {"t": [True, True, True]}, started=1.8e9)
    lmeval_format.accuracy_run(tmp_path / "c", "ridge", {"other": [True, True]}, started=1.8e9)
    filled_run(lmeval_format, tmp_path / "f1", "exact", [True, False], filled=False)
    filled_run(lmeval_format, tmp_path / "f2", "ridge", [True, True], filled=False, started=1.8e9)
    _other_runs(lmeval_format, tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "a.txt").write_text("not json")
    values = {"tmp": str(tmp_path), **{k: str(tmp_path / k) for k in ("a", "b", "c", "f1", "f2", "w", "w2", "p", "n",
                                                                        "g", "v", "m", "t", "x", "k1", "k2")}}
    argv = [a.format(**values) for a in runs + extra]
    if "--reference" not in argv:
        argv += ["--reference", "exact"]
    if "{a}" in runs and "{n}" in runs:  # the reference records its parameter count too
        data = json.loads(next((tmp_path / "a").rglob("results_*.json")).read_text())
        assert "model_num_parameters" not in data["config"]
        lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True]},
                                   config_extra={"model_num_parameters": 1000})
    assert main(["report", *argv, "--html", str(tmp_path / "r.html"), "--resamples", "100"]) == code
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_cross_model_compares_other_weights_and_labels_every_output(tmp_path, lmeval_format):
    """#24 item 1: the comparison refused above runs when asked for, and every output format says so."""
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True, True]})
    lmeval_format.accuracy_run(tmp_path / "p", "ridge", {"t": [True, True, True]},
                               model_args={"pretrained": "/models/tuned"}, started=1.8e9)
    extra = ["--cross-model", "--latex", str(tmp_path / "r.tex"), "--json", str(tmp_path / "r.json")]
    assert _report(tmp_path, tmp_path / "a", tmp_path / "p", extra=extra) == 0
    label = "cross-model comparison: ridge vs exact differ in model (pretrained) '/models/tuned' vs '/models/tiny'"
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["cross_model"] == [label]
    html, md, tex = ((tmp_path / f"r.{ext}").read_text() for ext in ("html", "md", "tex"))
    assert 'id="cross-model"' in html and "Cross-model comparison" in html
    assert "**Cross-model comparison**" in md and "/models/tuned" in md
    assert r"\textbf{Cross-model comparison}" in tex and r"\item cross-model comparison: ridge vs exact" in tex
    # the partial pairing (3 of exact's 4 items have a partner) is stated in every format
    left_out = "ridge vs exact: 1 items without a partner left out"
    assert left_out in summary["notes"] and left_out in html and left_out in md and f"% note: {left_out}" in tex


def test_arms_of_one_model_recorded_two_ways_still_pair(tmp_path, lmeval_format):
    """The hf reference records no fingerprint: the same `pretrained` pairs with a fingerprinted arm; two
    fingerprinted arms pair when the fingerprints agree, whatever path each loaded the weights from."""
    lmeval_format.accuracy_run(tmp_path / "a", "exact", {"t": [True, False, True]})
    lmeval_format.accuracy_run(tmp_path / "r", "ridge", {"t": [True, True, True]}, started=1.8e9,
                               config_extra={"rf_eval": {"weights_sha256": "4" * 64}})
    assert _report(tmp_path, tmp_path / "a", tmp_path / "r") == 0
    lmeval_format.accuracy_run(tmp_path / "a2", "exact", {"t": [True, False, True]}, model_args={"pretrained": "/copy"},
                               config_extra={"rf_eval": {"weights_sha256": "4" * 64}})
    assert _report(tmp_path, tmp_path / "a2", tmp_path / "r") == 0
