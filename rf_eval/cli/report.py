"""`rf-eval report RUN_DIR... --reference NAME [--html FILE] [--latex FILE] [--markdown FILE] [--json FILE]`.

Reads lm-eval output folders (run with --log_samples) of several arms, pairs
every arm with the reference per item, and writes the paper's statistics
(paired bootstrap intervals, non-inferiority with the binomial floor, sign
tests) in each format asked for, one or more: a self-contained HTML page, LaTeX tables, Markdown, JSON. Each task is
read by its paper measures unless `--metric` names others (`keytoken_nll`: key-
and novel-token ΔNLL, the novel-token perplexity gap and KL, all-token ΔNLL
beside them; RULER: acc_filled; `rf_eval.stats.measures`), and every interval
resamples within the strata each row names (task, RULER task, domain, length:
`rf_eval.stats.strata`). `--strata copyable` adds keytoken_nll's copyable-share
bins (`--copyable-bins`, `rf_eval.stats.copyable`; paper section 4.7, Table 13) to
the strata and shows its measures per bin; every generation task's length-cap
hits are counted per arm beside the reference's (`rf_eval.stats.cap_hits`;
sections 4.5, 4.6).

Nothing is reported silently wrong: a task whose primary metric has no value
on any item (e.g. a `*_filled` task whose tail covers every needle) stops the
report (exit 2) unless `--allow-empty` leaves it out; every table's caption
names the metric it shows; runs with no items in common with the reference,
or a single arm, stop it too, and so do arms run on other weights or another
task protocol than the reference (`rf_eval.stats.comparable`) unless
`--cross-model` asks for that comparison, which every output then labels. With `--ledger`, the head each run recorded
(`$RF_EVAL_LEDGER`) must still be in the ledger, every result file the ledger
recorded must be unchanged, the results and samples files read are recorded
in it (`rf_eval.stats.ledger_results`), and the report records the head it saw. `--latex` writes a fragment to `\\input` (`--latex-standalone`:
a whole document).

Outputs never replace a file rf-eval did not write (`rf_eval.files.outputs`): every output path is checked before
anything is read or written, and an existing file without rf-eval's output mark (a `--latex paper.tex` that
names the paper itself) stops the report unless `--overwrite` is given. Every samples file read is checked
against the seal its run wrote (`rf_eval.integrity.seal`): one edited or truncated since stops the report, and
so does a run of rf-eval's models whose seal is missing or another run's, unless `--allow-unsealed`.

The work is `rf_eval.reports.build.build_report`'s (what a study and the demo call); this module parses the
options into its `ReportOptions`.
"""

from __future__ import annotations

import argparse

from rf_eval.cli import UserError
from rf_eval.cli.values import nonnegative_float, nonnegative_int, positive_int, probability
from rf_eval.stats.copyable import DEFAULT_EDGES, STRATA, parse_edges


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="lm-eval --output_path folders (or results files)")
    parser.add_argument("--reference", required=True, metavar="NAME", help="the arm every other arm is compared with")
    parser.add_argument("--margin", type=nonnegative_float, default=2.0, help="non-inferiority margin in points (default 2)")
    parser.add_argument("--ledger", metavar="FILE", help="run ledger: mark comparisons registered or follow-up")
    parser.add_argument("--html", metavar="FILE", help="write the HTML report here (give one or more formats)")
    parser.add_argument("--latex", metavar="FILE", help="write LaTeX tables (booktabs), a fragment to \\input")
    parser.add_argument("--latex-standalone", dest="latex_standalone", action="store_true",
                        help="write --latex as a whole document instead of a fragment")
    parser.add_argument("--allow-empty", dest="allow_empty", action="store_true",
                        help="leave out (with a note) tasks whose primary metric has no value on any item, "
                             "instead of failing")
    parser.add_argument("--allow-unsealed", dest="allow_unsealed", action="store_true",
                        help="report runs of rf-eval's models whose results seal is missing or another run's "
                             "(refused otherwise; the report notes it)")
    parser.add_argument("--cross-model", dest="cross_model", action="store_true",
                        help="compare arms run on other weights or another task protocol than the reference "
                             "(refused otherwise); every output then labels those comparisons")
    parser.add_argument("--markdown", metavar="FILE", help="write Markdown tables")
    parser.add_argument("--json", metavar="FILE",
                        help="write every figure of the report as JSON (what the tables are rendered from)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace output files rf-eval did not write (refused otherwise; its own earlier "
                             "outputs are replaced without it)")
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
        help="metrics to report for a task, the first primary (default: the task's paper measures, "
             "else its first metric with values)",
    )
    parser.add_argument("--strata", action="append", default=[], choices=STRATA,
                        help="add a stratification: `copyable` resamples keytoken_nll's comparisons within "
                             "copyable-share bins and shows its measures table per bin (paper Table 13)")
    parser.add_argument("--copyable-bins", dest="copyable_bins", metavar="CUT[,CUT...]",
                        help="cut points of the copyable-share bins, increasing, each strictly between 0 and 1 "
                             f"(default {','.join(f'{x:g}' for x in DEFAULT_EDGES)}: [0, 0.1), [0.1, 0.5), "
                             "[0.5, 1]; a share on a cut point goes to the bin above)")
    parser.add_argument("--ttft", action="append", default=[], metavar="FILE",
                        help="`rf-eval ttft` results: their speed rows join the report's speed table (repeatable)")
    parser.add_argument("--resamples", type=positive_int, default=10_000, help="bootstrap resamples (default 10,000)")
    parser.add_argument("--confidence", type=probability, default=0.95, help="interval level (default 0.95)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed (default 0)")


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


def run(args: argparse.Namespace) -> int:
    from rf_eval.reports.build import ReportOptions, build_report

    bins = None
    if args.copyable_bins is not None:
        if "copyable" not in args.strata:
            raise UserError("--copyable-bins needs --strata copyable")
        try:
            bins = parse_edges(args.copyable_bins)
        except ValueError as err:
            raise UserError(str(err)) from None
    report = build_report(ReportOptions(
        args.runs, reference=args.reference, html=args.html, margin=args.margin, ledger=args.ledger,
        latex=args.latex, latex_standalone=args.latex_standalone, markdown=args.markdown, json_path=args.json,
        overwrite=args.overwrite, allow_empty=args.allow_empty, allow_unsealed=args.allow_unsealed,
        cross_model=args.cross_model,
        controls=_mapping("--control", args.control), metrics=_mapping("--metric", args.metric),
        strata=args.strata, copyable_bins=bins, ttft=args.ttft, resamples=args.resamples,
        confidence=args.confidence, seed=args.seed))
    for line in report.lines:
        print(line)
    return 0
