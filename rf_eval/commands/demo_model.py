"""`rf-eval demo-model [--print-path]`: convert the embedded demo model once (or reuse it) and show where."""

from __future__ import annotations

import argparse
import logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-path", action="store_true", help="print only the model folder's path")
    parser.add_argument("--cache-dir", help="cache folder (default: $RF_EVAL_CACHE or ~/.cache/rf-eval)")


def run(args: argparse.Namespace) -> int:
    from rf_eval.demo_model import demo_model_dir

    if not args.print_path:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = demo_model_dir(args.cache_dir)
    print(path if args.print_path else f"demo model (SmolLM2-135M-Instruct, fp32 safetensors): {path}")
    return 0
