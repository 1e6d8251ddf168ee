"""`rf-eval report` is a shell over `rf_eval.reports.build.build_report`: every option reaches one of its
keyword arguments, and the command line a study prints gives the command the arguments the study passes."""

from __future__ import annotations

import argparse
import inspect
from types import SimpleNamespace

from rf_eval.cli import as_argv, options
from rf_eval.cli.report import add_arguments
from rf_eval.reports.build import build_report
from rf_eval.study.runner import report_arguments, report_argv

#: option destinations whose keyword argument has another name
RENAMED = {"json": "json_path", "metric": "metrics", "control": "controls"}


def report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_report_option_is_a_build_report_argument():
    dests = {a.dest for a in report_parser()._actions if a.dest != "help"}
    params = set(inspect.signature(build_report).parameters)
    assert {RENAMED.get(d, d) for d in dests} == params


def test_the_study_prints_the_command_line_of_the_arguments_it_passes(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("")
    study = SimpleNamespace(arms={"exact": None, "ridge": None, "nofill": None}, reference="exact", margin=5,
                            controls={"ridge": ["nofill", "exact"]}, arms_folder="arms")
    given = report_arguments(study, tmp_path, ledger)
    argv = report_argv(study, tmp_path, ledger)
    expected = options("report", runs=given["runs"], reference="exact", margin=5.0, html=given["html"],
                       latex=given["latex"], markdown=given["markdown"], json=given["json_path"],
                       ledger=str(ledger), control=["ridge=nofill,exact"])
    assert argv == as_argv("report", expected)
    parsed = report_parser().parse_args(argv[1:])
    assert (parsed.runs, parsed.margin, parsed.json, parsed.ledger, parsed.control) == (
        given["runs"], 5.0, given["json_path"], str(ledger), ["ridge=nofill,exact"])
    assert "--ledger" not in report_argv(study, tmp_path, tmp_path / "none.jsonl")  # no ledger file yet
