"""`rf-eval demo [--out DIR] [--quick] [--readme README.md]`: fit, run the arms through lm_eval, write the
report and the demo's table (`OUT/demo_table.md`; with --readme, also into that file's block)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rf_eval.cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="rf-eval-demo", help="folder for the runs and the report")
    p.add_argument("--quick", action="store_true", help="one task, one length, a few samples (a few minutes)")
    p.add_argument("--readme", type=Path, default=None, metavar="FILE",
                   help="also write the demo's table into FILE, between its marker comments for this size")


def run(args: argparse.Namespace) -> int:
    from rf_eval.study.demo_run import run_demo
    from rf_eval.study.study_file import StudyError

    try:
        run_demo(Path(args.out), quick=args.quick, readme=args.readme)
    except StudyError as err:  # e.g. --out holds the other size's demo (--quick or not)
        raise UserError(str(err)) from None
    except (OSError, ValueError) as err:  # --readme missing, or without the table's markers
        if args.readme is None:
            raise
        raise UserError(f"--readme {args.readme}: {err}") from None
    return 0
