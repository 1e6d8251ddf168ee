"""`rf-eval report` is a shell over `rf_eval.reports.build.build_report`: every option reaches one of its
keyword arguments, and the command line a study prints gives the command the arguments the study passes."""

from __future__ import annotations

import argparse
import inspect
from types import SimpleNamespace

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
