"""`rf-eval demo [--out DIR] [--quick]`: fit, run the arms through lm_eval, write the report."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="rf-eval-demo", help="folder for the runs and the report")
    p.add_argument("--quick", action="store_true", help="one task, one length, a few samples (a few minutes)")


def run(args: argparse.Namespace) -> int:
    from rf_eval.cli import UserError
    from rf_eval.demo.study import run_demo
    from rf_eval.study.spec import StudyError

    try:
        run_demo(Path(args.out), quick=args.quick)
    except StudyError as err:  # e.g. --out holds the other size's demo (--quick or not)
        raise UserError(str(err)) from None
    return 0
