"""`rf-eval report` is a shell over `rf_eval.reports.build.build_report`: every option is a field of its
`ReportOptions`, and the command line a study prints gives the command the options the study passes."""

from __future__ import annotations

import argparse
from dataclasses import fields
from types import SimpleNamespace

from rf_eval.cli.report import _mapping, add_arguments
from rf_eval.reports.build import ReportOptions
from rf_eval.reports.build import report_argv as options_argv
from rf_eval.stats.copyable import parse_edges
from rf_eval.study.runner import report_argv, report_options

#: option destinations whose `ReportOptions` field has another name
RENAMED = {"json": "json_path", "metric": "metrics", "control": "controls"}


def report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_report_option_is_a_report_options_field():
    dests = {a.dest for a in report_parser()._actions if a.dest != "help"}
    params = {f.name for f in fields(ReportOptions)}
    assert {RENAMED.get(d, d) for d in dests} == params


def passed(options: ReportOptions) -> dict:
    """The fields of `options` that are not at their defaults (those without one included)."""
    return {f.name: getattr(options, f.name) for f in fields(options) if getattr(options, f.name) != f.default}


def test_the_study_prints_the_command_line_of_the_arguments_it_passes(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    study = SimpleNamespace(arms={"exact": None, "ridge": None, "nofill": None}, reference="exact", margin=5,
                            controls={"ridge": ["nofill", "exact"]}, arms_folder="arms")
    given = passed(report_options(study, tmp_path, ledger))
    argv = report_argv(study, tmp_path, ledger)
    assert argv[0] == "report"
    parsed = vars(report_parser().parse_args(argv[1:]))
    defaults = vars(report_parser().parse_args(["run", "--reference", "r", "--html", "h"]))
    assert parsed.pop("control") == ["ridge=nofill,exact"] and given.pop("controls") == {"ridge": ["nofill", "exact"]}
    for option, value in parsed.items():  # each option the study passed, the others at their defaults
        name = RENAMED.get(option, option)
        assert value == given.get(name, defaults[option]), option
    assert set(given) <= {RENAMED.get(o, o) for o in parsed}
    assert (parsed["margin"], parsed["ledger"]) == (5.0, str(ledger))
    assert "--ledger" not in report_argv(study, tmp_path, tmp_path / "none.jsonl")  # no ledger file yet


def test_the_command_line_carries_every_option_given(tmp_path):
    options = ReportOptions(
        ["a", tmp_path], reference="exact", html="r.html", margin=0.5, ledger="l.jsonl", latex="r.tex",
        latex_standalone=True, markdown="r.md", json_path="r.json", overwrite=True, allow_empty=True, allow_unsealed=True,
        cross_model=True, controls={"ridge": ["nofill", "exact"]}, metrics={"keytoken_nll": ["nll_key", "kl"]},
        strata=["copyable"], copyable_bins=(0.2, 0.75), ttft=["t1.json", "t2.json"], resamples=300,
        confidence=0.9, seed=7)
    argv = options_argv(options)
    assert argv[0] == "report"
    parsed = vars(report_parser().parse_args(argv[1:]))
    parsed["control"] = _mapping("--control", parsed["control"])
    parsed["metric"] = _mapping("--metric", parsed["metric"])
    parsed["copyable_bins"] = tuple(parse_edges(parsed["copyable_bins"]))
    assert {RENAMED.get(o, o): v for o, v in parsed.items()} == {
        **passed(options), "runs": ["a", str(tmp_path)], "strata": ["copyable"], "ttft": ["t1.json", "t2.json"]}
