"""`rf-eval fetch-data --tasks T [T ...] --out DIR`: download what rf-eval's tasks read from the network,
where the network is reachable, for runs on nodes without one (`rf_eval.tasks.data`).

Then run with `--metadata '{"data_dir": "DIR"}'` or RF_EVAL_DATA=DIR: the tasks
read the essays, nltk's punkt_tab, the RULER QA sets and the LongBench v2
items from DIR (`rf_eval.tasks.data_fetch`). DIR/manifest.json records each piece's sha256, source and time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rf_eval.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", nargs="+", required=True,
                        help="rf-eval task names, space- or comma-separated (e.g. ruler_filled longbench_v2_cot)")
    parser.add_argument("--out", required=True, type=Path, help="the data folder to write (created if missing)")
    parser.add_argument("--force", action="store_true", help="download again what DIR already holds")


def run(args: argparse.Namespace) -> int:
    from rf_eval.tasks.data import DATA_ENV, DATA_OPTION, offline
    from rf_eval.tasks.data_fetch import fetch

    tasks = [t.strip() for item in args.tasks for t in item.split(",") if t.strip()]
    if not tasks:
        raise UserError(f"--tasks {' '.join(args.tasks)!r} names no task; give rf-eval task names, e.g. "
                        "--tasks ruler_filled longbench_v2_cot")
    if offline():
        raise UserError("fetch-data downloads, but HF_HUB_OFFLINE is set: unset it, on a machine with a network")
    out = args.out.expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)  # before any download: a folder that cannot be written, said so
    except OSError as err:
        raise UserError(f"--out {out}: cannot create this folder here ({err.strerror or err}); give a folder "
                        "you can write") from None
    fetch(tasks, out, force=args.force)
    print(f"done: run with --metadata '{{\"{DATA_OPTION}\": \"{out}\"}}' or {DATA_ENV}={out}")
    return 0
