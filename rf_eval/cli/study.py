"""`rf-eval study run|plan|status`: a whole registered study (see `rf_eval.study`) in one command.

    rf-eval study plan STUDY.yaml                 # each arm's lm_eval command and MAC cost; runs nothing
    rf-eval study run STUDY.yaml --out DIR        # register, run the arms (resumable), report
    rf-eval study run STUDY.yaml --out DIR --launcher slurm --partition gpu --gpus 1 --minutes 240 [--detach]
    rf-eval study status DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rf_eval.cli import UserError
from rf_eval.cli.values import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    plan = sub.add_parser("plan", help="print each arm's lm_eval command and MAC cost; run nothing")
    plan.add_argument("study")
    plan.add_argument("--out", default="study-out", help="the folder the commands would write (default study-out)")
    run = sub.add_parser("run", help="register the claims, run every arm not yet done, write the report")
    run.add_argument("study")
    run.add_argument("--out", required=True, help="the study's folder (arms, caches, logs, report, study.json)")
    run.add_argument("--ledger", default=None, help="the run ledger (default OUT/ledger.jsonl)")
    run.add_argument("--follow-up", action="store_true", help="register claims although results exist")
    run.add_argument("--no-report", action="store_true", help="run the arms only")
    run.add_argument("--launcher", default="local", choices=("local", "accelerate", "slurm"))
    run.add_argument("--parallel", type=positive_int, default=None,
                     help="local: arms at once (default 1); slurm: arms of the array at once (default 64)")
    run.add_argument("--processes", type=positive_int, default=1, help="accelerate: processes (devices) per arm")
    run.add_argument("--partition", default=None, help="slurm partition")
    run.add_argument("--gpus", type=positive_int, default=1, help="slurm: GPUs per arm")
    run.add_argument("--minutes", type=positive_int, default=240, help="slurm: time limit per arm")
    run.add_argument("--slurm-cluster", default=None,
                     help="submitit cluster (default slurm where sbatch is on PATH; `local`: its local executor)")
    run.add_argument("--detach", action="store_true",
                     help="slurm: return once the jobs are submitted (the report job writes the report)")
    status = sub.add_parser("status", help="what is done in a study's folder")
    status.add_argument("out")


def run(args: argparse.Namespace) -> int:
    from rf_eval.study.launchers import LauncherOptions, make_launcher
    from rf_eval.study.plan import plan_text
    from rf_eval.study.preflight import build_task_data, check_study
    from rf_eval.study.runner import run_study
    from rf_eval.study.state import status_text
    from rf_eval.study.study_file import StudyError, load_study

    if args.action == "status":
        print(status_text(Path(args.out)))
        return 0
    try:
        study = load_study(args.study)
        check_study(study)  # task names and their data, before anything is registered or fitted
        out = Path(args.out).resolve()
        if args.action == "plan":
            print(plan_text(study, out, make_launcher("local", out)))
            return 0
        try:
            options = LauncherOptions(parallel=args.parallel, processes=args.processes, partition=args.partition,
                                      gpus=args.gpus, minutes=args.minutes, slurm_cluster=args.slurm_cluster,
                                      detach=args.detach)
            launcher = make_launcher(args.launcher, out, options)
        except ValueError as err:
            raise UserError(str(err)) from None
        builds = build_task_data(study)  # the samples, before the claims are registered
        print(f"[data] {', '.join(study.tasks)}: built ({builds} data setting{'s' if builds > 1 else ''})", flush=True)
        return run_study(study, out, launcher, ledger=Path(args.ledger) if args.ledger else None,
                         follow_up=args.follow_up, report=not args.no_report)
    except StudyError as err:
        raise UserError(str(err)) from None
