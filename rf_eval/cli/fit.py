"""`rf-eval fit`: capture + ridge fit of RidgeFill maps (or new solves from saved sums).

Under `torchrun --nproc_per_node K -m rf_eval fit ...` the documents are
sharded across the K processes and the sums all-reduced (gloo on CPU, NCCL
on CUDA); rank 0 writes the files.
"""

from __future__ import annotations

import argparse
import os

from rf_eval.cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="HF model folder or id (required unless --from-sums with one lambda)")
    p.add_argument("--splits", type=int, nargs="+", help="split layers S (one capture pass serves all)")
    p.add_argument("--calibration", nargs="+", default=[], help="plain-text files or JSONL with a 'text' field")
    p.add_argument("--heldout", nargs="+", default=[], help="held-out documents for choosing lambda")
    p.add_argument("--lambdas", type=float, nargs="+", default=None,
                   help="lambda grid (default: nine values 1e-4..1 with --heldout, else 0.03)")
    p.add_argument("--from-sums", dest="from_sums", help="folder of saved sums: new solves, no capture")
    p.add_argument("--out", required=True, help="folder for the map files (and the sums)")
    p.add_argument("--max-tokens", type=int, default=32768, help="truncate documents to this many tokens")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--map-split", dest="map_split", action=argparse.BooleanOptionalAction, default=True,
                   help="the arms read layer S's own map (the paper's released maps; default): the held-out "
                        "lambda choice scores layer S too. --no-map-split: layer S reads x_S, not scored")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")


def load_model(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.devices import default_device, parse_dtype

    device = args.device or default_device()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=parse_dtype(args.dtype, device), trust_remote_code=args.trust_remote_code
    ).to(device)
    return model.eval(), AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)


def init_distributed() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def run(args: argparse.Namespace) -> int:
    from rf_eval.ridgefill.calibration import CalibrationError
    from rf_eval.ridgefill.fitting import fit_maps, refit_from_sums

    try:
        if args.from_sums:
            if not args.lambdas:
                raise UserError("--from-sums needs --lambdas")
            model = tokenizer = None
            if args.model:
                model, tokenizer = load_model(args)
            result = refit_from_sums(args.from_sums, out=args.out, lambdas=args.lambdas, model=model,
                                     tokenizer=tokenizer, heldout=args.heldout, max_tokens=args.max_tokens,
                                     progress=not args.no_progress, map_split=args.map_split)
        else:
            if not args.model or not args.splits:
                raise UserError("fit needs --model and --splits (or --from-sums)")
            from rf_eval.ridgefill.calibration import check_nonempty
            from rf_eval.ridgefill.fitting import check_lambdas

            check_lambdas(args.lambdas, bool(args.heldout))  # fail before loading the model
            check_nonempty(args.calibration)
            init_distributed()
            model, tokenizer = load_model(args)
            result = fit_maps(model, tokenizer, splits=args.splits, calibration=args.calibration,
                              heldout=args.heldout, lambdas=args.lambdas, out=args.out,
                              max_tokens=args.max_tokens, progress=not args.no_progress,
                              map_split=args.map_split)
    except (ValueError, CalibrationError) as err:
        raise UserError(str(err)) from err
    for split, path in sorted(result.paths.items()):
        scores = result.scores[split]
        extra = f" (held-out cosine {scores[result.chosen[split]]:.4f})" if scores else ""
        print(f"split {split}: lambda {result.chosen[split]:g}{extra}, {result.rows} rows -> {path}")
    return 0
