"""`rf-eval report RUN_DIR... --reference NAME --html FILE [--latex FILE] [--markdown FILE]`.

Reads lm-eval output folders (run with --log_samples) of several arms, pairs
every arm with the reference per item, and writes the paper's statistics
(paired bootstrap intervals, non-inferiority with the binomial floor, sign
tests) as a self-contained HTML page, LaTeX tables and Markdown.
"""

from __future__ import annotations

import argparse

from rf_eval.cli import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="lm-eval --output_path folders (or results files)")
    parser.add_argument("--reference", required=True, metavar="NAME", help="the arm every other arm is compared with")
    parser.add_argument("--margin", type=float, default=2.0, help="non-inferiority margin in points (default 2)")
    parser.add_argument("--ledger", metavar="FILE", help="run ledger: mark comparisons registered or follow-up")
    parser.add_argument("--html", required=True, metavar="FILE", help="write the HTML report here")
    parser.add_argument("--latex", metavar="FILE", help="also write LaTeX tables (booktabs)")
    parser.add_argument("--markdown", metavar="FILE", help="also write Markdown tables")
    parser.add_argument(
        "--control",
        action="append",
        default=[],
        metavar="SELECTED=CONTROL[,CONTROL...]",
        help="report a selection's margin over its count-matched control arms (repeatable)",
    )
    parser.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="TASK=METRIC[,METRIC...]",
        help="metrics to report for a task, the first primary (default: its first metric with values)",
    )
    parser.add_argument("--ttft", action="append", default=[], metavar="FILE",
                        help="`rf-eval ttft` results: their speed rows join the report's speed table (repeatable)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10,000)")
    parser.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def _mapping(option: str, specs: list[str]) -> dict[str, list[str]]:
    """NAME=A[,B...] options as {NAME: [A, B, ...]}."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        names = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not names:
            raise UserError(f"{option} {spec!r}: expected NAME=VALUE[,VALUE...]")
        out[key.strip()] = names
    return out


def ttft_speed_rows(paths: list[str]) -> list[dict]:
    """Speed rows of `rf-eval ttft` result files (medians and ratios, no intervals: paper section 3.4)."""
    import json

    rows = []
    for path in paths:
        try:
            data = json.loads(open(path).read())
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"--ttft {path}: {err}") from None
        if data.get("kind") != "rf-eval-ttft":
            raise UserError(f"--ttft {path}: not an `rf-eval ttft` result (kind {data.get('kind')!r})")
        rows.extend(data["speed"])
    return rows


def run(args: argparse.Namespace) -> int:
    from rf_eval.reports.render import write_reports
    from rf_eval.stats.ledger import LedgerError, verify_ledger
    from rf_eval.stats.pairing import PairingError
    from rf_eval.stats.runs import RunFormatError, load_runs
    from rf_eval.stats.summary import study_summary

    if args.margin < 0 or args.resamples < 1 or not 0 < args.confidence < 1:
        raise UserError("--margin must be >= 0, --resamples >= 1 and --confidence in (0, 1)")
    try:
        runs = load_runs(args.runs, metrics=_mapping("--metric", args.metric))
        ledger = verify_ledger(args.ledger) if args.ledger else None
        summary = study_summary(
            runs,
            args.reference,
            margin=args.margin,
            confidence=args.confidence,
            n_resamples=args.resamples,
            seed=args.seed,
            ledger=ledger,
            controls=_mapping("--control", args.control),
        )
    except LedgerError as err:
        raise UserError(f"ledger {args.ledger}: {err}") from None
    except (RunFormatError, PairingError, ValueError) as err:
        raise UserError(str(err)) from None
    summary["speed"] = list(summary["speed"]) + ttft_speed_rows(args.ttft)
    for path in write_reports(summary, html=args.html, latex=args.latex, markdown=args.markdown):
        print(f"wrote {path}")
    for note in summary["notes"]:
        print(f"note: {note}")
    return 0
