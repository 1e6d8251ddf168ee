"""`rf-eval fit`: capture + ridge fit of RidgeFill maps (or new solves from saved sums); the options as
`rf_eval.ridgefill.fit_run.FitOptions`, which `fit_map_files` runs.

Under `torchrun --nproc_per_node K -m rf_eval fit ...` the documents are
sharded across the K processes and the sums all-reduced (gloo on CPU, NCCL
on CUDA); rank 0 writes the files.

Inputs are checked before the model loads: a local `--model` path that does
not exist, an `--out` that is a file or a non-empty folder (without
`--overwrite`), a `--device` this machine lacks. The files are written into
`.<out>.partial` beside `--out` and moved into it only when the fit is
complete, so a failed or killed fit leaves `--out` as it was.
"""

from __future__ import annotations

import argparse

from rf_eval.cli.values import positive_float, positive_int
from rf_eval.engine.plan import DEFAULT_MAP_SPLIT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="HF model folder or id (required unless --from-sums with one lambda)")
    p.add_argument("--splits", type=positive_int, nargs="+", help="split layers S (one capture pass serves all)")
    p.add_argument("--fill", default=None, metavar="FILL",
                   help="the fill the maps serve (default ridge; `rf-eval fills` lists those with maps)")
    p.add_argument("--calibration", nargs="+", default=[], help="plain-text files or JSONL with a 'text' field")
    p.add_argument("--heldout", nargs="+", default=[], help="held-out documents for choosing lambda")
    p.add_argument("--lambdas", type=positive_float, nargs="+", default=None,
                   help="lambda grid (default: nine values 1e-4..1 with --heldout, else 0.03)")
    p.add_argument("--from-sums", dest="from_sums", help="folder of saved sums: new solves, no capture")
    p.add_argument("--out", required=True, help="folder for the map files (and the sums); must be empty or new")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing files of the same name")
    p.add_argument("--max-tokens", type=positive_int, default=32768, help="truncate documents to this many tokens")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--map-split", dest="map_split", action=argparse.BooleanOptionalAction,
                   default=DEFAULT_MAP_SPLIT,
                   help="the arms read layer S's own map (the paper's released maps and MAC accounting): the "
                        "held-out lambda choice scores layer S too. Default --no-map-split: layer S reads x_S "
                        "(exact), not scored")
    p.add_argument("--sums-device", dest="sums_device", choices=("auto", "cpu", "model"), default="auto",
                   help="where the fp64 running sums live: auto (the model's GPU if they fit there with a margin, "
                        "else CPU memory), cpu, model")
    p.add_argument("--heldout-memory", dest="heldout_memory", default="auto", metavar="GIB",
                   help="GiB of maps one held-out lambda pass may hold: the grid is scored in passes that fit "
                        "(auto, default: half the available CPU memory, where the maps live)")
    p.add_argument("--int8", action="store_true",
                   help="store the maps in the paper's release format: int8 with one bf16 scale per 128 weights of each "
                        "row and a bf16 bias (the sums stay fp64, so --from-sums can write fp32 maps again)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from rf_eval.ridgefill.fit_run import FitOptions, fit_map_files, fit_summary

    options = FitOptions(model=args.model, splits=args.splits, fill=args.fill, calibration=args.calibration,
                         heldout=args.heldout, lambdas=args.lambdas, from_sums=args.from_sums,
                         overwrite=args.overwrite, max_tokens=args.max_tokens, device=args.device,
                         dtype=args.dtype, map_split=args.map_split, sums_device=args.sums_device,
                         heldout_memory=args.heldout_memory, int8=args.int8,
                         trust_remote_code=args.trust_remote_code, progress=not args.no_progress)
    result = fit_map_files(args.out, options)
    for line in fit_summary(result):
        print(line)
    return 0
