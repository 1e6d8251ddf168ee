"""`rf-eval tiny-model --family F --out DIR`."""

from __future__ import annotations

import argparse

from rf_eval.cli.values import nonnegative_int
from rf_eval.families import registered_families
from rf_eval.testing import make_tiny_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, choices=registered_families())
    parser.add_argument("--out", required=True, help="folder to write the model and tokenizer to")
    parser.add_argument("--seed", type=nonnegative_int, default=0)


def run(args: argparse.Namespace) -> int:
    out = make_tiny_model(args.family, args.out, seed=args.seed)
    print(f"wrote tiny {args.family} model to {out}")
    return 0
