"""`rf-eval ledger add|verify`: the hash-chained run ledger (paper section 9, Registration).

`add` appends a claim, its prediction and the sha256 of each config file,
chained to the previous entry, and prints the new head hash (keep it: it is
what shows that no entry was deleted from the end). `verify` checks the whole
chain: it fails on an edited byte, reordered entries and entries deleted from
the middle or start. Deleting entries from the *end* leaves a valid shorter
chain: only `--expect-head HASH[:COUNT]` (a head recorded earlier: printed by
`add` and `verify`, stored in runs' results and in reports) detects it.
`verify` also re-hashes every result file a report recorded in the ledger
(`rf_eval.stats.ledger_results`) and names one that was edited or removed.
"""

from __future__ import annotations

import argparse

from rf_eval.cli import UserError
from rf_eval.stats.ledger import LedgerError, append_entry, parse_head, verify_ledger
from rf_eval.stats.ledger_results import check_results

DEFAULT_LEDGER = "rf-eval-ledger.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="{add,verify}")
    add = sub.add_parser("add", help="register a claim before its runs")
    add.add_argument("--claim", required=True, help="what the runs will test")
    add.add_argument("--prediction", required=True, help="the prediction and its decision rule")
    add.add_argument("--config", required=True, nargs="+", metavar="FILE", help="the runs' configuration files")
    add.add_argument("--arm", nargs="*", default=[], metavar="NAME", help="report arm names this entry covers")
    verify = sub.add_parser("verify", help="check the whole chain")
    verify.add_argument("--head", help="expected hash of the last entry (detects deleted tail entries)")
    verify.add_argument("--expect-head", dest="expect_head", metavar="HASH[:COUNT]",
                        help="a head recorded earlier (by add, a run's results or a report): the chain must hold "
                             "it (entry COUNT-1 has hash HASH), so a ledger cut after it fails")
    for p in (add, verify):
        p.add_argument("--ledger", default=DEFAULT_LEDGER, metavar="FILE", help=f"default {DEFAULT_LEDGER}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "add":
            entry = append_entry(
                args.ledger, claim=args.claim, prediction=args.prediction, configs=args.config, arms=args.arm
            )
            print(f"entry {entry.index} added to {args.ledger} at {entry.time.isoformat()}; "
                  f"the chain holds {entry.index + 1} entries")
            print(f"head {entry.hash}")
            return 0
        expect = parse_head(args.expect_head) if args.expect_head else None
        entries = verify_ledger(args.ledger, head=args.head, expect=expect)
        checked = check_results(args.ledger, entries)
    except LedgerError as err:
        raise UserError(f"{args.ledger}: {err}") from None
    head = f"{entries[-1].hash}:{len(entries)}" if entries else "(empty)"
    held = f"; holds the expected head {expect}" if expect is not None else ""
    files = f"; {checked} recorded result files unchanged" if checked else ""
    print(f"{args.ledger}: {len(entries)} entries, chain intact{held}{files}; head {head}")
    return 0
