"""`rf-eval overlap --calibration FILE... --eval PATH... [--words 50] [--json OUT]`: do the calibration texts
overlap the evaluation texts? The check of RidgeFill Appendix G (`rf_eval.study.overlap`): equal sha256 of whole
texts, and pairs sharing a run of `--words` (default 50, section 6.7's rule) or more consecutive words, and with
`--tokenizer NAME...` as many consecutive tokens under each tokenizer (Appendix G's first check).

Exit status: 0 when no pair shares such a run and no hashes match; 1 when overlap is found (the last line
says so), so a script can gate on it; 2 for bad input.
"""

from __future__ import annotations

import argparse
import json

from rf_eval.cli.values import positive_int
from rf_eval.files.outputs import check_output, stamp_json, write_output
from rf_eval.study.overlap import DEFAULT_WORDS, check_files, load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", nargs="+", required=True, metavar="FILE",
                   help="calibration files, as `rf-eval fit --calibration` reads them: plain text (one document "
                        "each) or JSONL with a 'text' field")
    p.add_argument("--eval", dest="evaluation", nargs="+", required=True, metavar="PATH",
                   help="evaluation documents, as keytoken_nll reads its `docs`: a folder of .txt / .jsonl files "
                        "(searched recursively) or one such file")
    p.add_argument("--words", type=positive_int, default=DEFAULT_WORDS,
                   help=f"the run length, in words, that counts as overlap (default {DEFAULT_WORDS})")
    p.add_argument("--tokenizer", nargs="+", default=[], metavar="NAME",
                   help="also count runs of --words tokens under each of these tokenizers (hub names or local "
                        "folders; Appendix G's check, one per model)")
    p.add_argument("--json", default=None, metavar="FILE", help="write every identical text and shared run here")
    p.add_argument("--overwrite", action="store_true", help="replace a --json file rf-eval did not write")


def run(args: argparse.Namespace) -> int:
    if args.json:  # before any reading: never over a file rf-eval did not write (`rf_eval.files.outputs`)
        check_output("--json", args.json, overwrite=args.overwrite)
    tokenizers = [load_tokenizer(name) for name in args.tokenizer]  # before reading texts: a bad name fails first
    results = check_files(args.calibration, args.evaluation, args.words, tokenizers)
    for result in results:
        if result.found:
            print(result.table())
    if args.json:
        record = {**results[0].record(), "by_tokens": [r.record() for r in results[1:]],
                  "calibration_files": list(args.calibration), "evaluation": list(args.evaluation)}
        write_output(args.json, json.dumps(stamp_json(record), indent=1) + "\n")
        print(f"wrote {args.json}")
    for result in results:
        print(result.line())
    return 1 if any(r.found for r in results) else 0
