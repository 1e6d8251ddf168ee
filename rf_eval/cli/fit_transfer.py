"""`rf-eval fit-transfer`: fit RaReCache's source -> target cache maps (paper section 3.1, appendix A).

    rf-eval fit-transfer --source SMALL --target LARGE --calibration FILE... \\
        [--k 8] [--rank 128] [--lambda 0.01] [--stride N] --out DIR

Under `torchrun --nproc_per_node K -m rf_eval fit-transfer ...` the documents
are sharded across processes and the sums all-reduced; rank 0 writes the file.
Memory: the fp64 sums hold, per side, a (L_s d_s)² Gram and an
(L_s d_s) x (L_t d_t) cross term (d = n_kv * d_h of one layer), whatever the
calibration size (`--sums-device cpu` keeps them in host memory).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rf_eval.cli import UserError
from rf_eval.cli.values import nonnegative_int, positive_float, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="the small model that prefills (HF folder or id)")
    p.add_argument("--target", required=True, help="the model whose cache is predicted (HF folder or id)")
    p.add_argument("--calibration", nargs="+", required=True, help="plain-text files or JSONL with a 'text' field")
    p.add_argument("--k", type=positive_int, default=8, help="source layers per target layer, chosen by R² (default 8)")
    p.add_argument("--rank", type=nonnegative_int, default=128, help="r of the well-described subspace V_r (default 128)")
    p.add_argument("--lambda", dest="lam", type=positive_float, default=0.01, help="ridge penalty of eq. 1 (default 0.01)")
    p.add_argument("--stride", type=positive_int, default=1, help="keep every N-th position of each document (default 1)")
    p.add_argument("--out", required=True, help="folder for rarecache_maps.safetensors")
    p.add_argument("--max-tokens", type=positive_int, default=32768, help="truncate documents to this many tokens")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--sums-device", default=None, help="where the fp64 sums live (default: the models' device)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace the maps file --out already holds")


def check_inputs(args: argparse.Namespace) -> None:
    """What can be refused before a tokenizer or weights load: the numbers, --out, both model folders, the
    device and dtype, and --k against the source model's layers (from its config)."""
    from transformers import AutoConfig

    from rf_eval.devices import check_device, check_model_source, parse_dtype
    from rf_eval.rarecache.maps import FILENAME

    if args.k < 1 or args.rank < 0 or args.stride < 1 or not args.lam > 0:
        raise UserError("need --k >= 1, --rank >= 0, --stride >= 1 and --lambda > 0")
    if args.max_tokens < 2:
        raise UserError(f"--max-tokens {args.max_tokens}: a document needs at least 2 tokens")
    out = Path(args.out)
    if out.is_file():
        raise UserError(f"--out {args.out} is a file; give a folder for {FILENAME}")
    if (out / FILENAME).exists() and not args.overwrite:
        raise UserError(f"--out {args.out} already holds {FILENAME}; choose a new folder, or pass --overwrite "
                        "to replace it")
    for option, check in (("--source", lambda: check_model_source(args.source)),
                          ("--target", lambda: check_model_source(args.target)),
                          ("--device", lambda: check_device(args.device)),
                          ("--sums-device", lambda: check_device(args.sums_device) if args.sums_device else None),
                          ("--dtype", lambda: parse_dtype(args.dtype, check_device(args.device)))):
        try:
            check()
        except ValueError as err:
            raise UserError(f"{option}: {err}") from None
    try:
        layers = AutoConfig.from_pretrained(args.source, trust_remote_code=args.trust_remote_code
                                            ).get_text_config().num_hidden_layers
    except (OSError, ValueError):
        return  # the model's own loading says why
    if args.k > layers:
        raise UserError(f"--k {args.k}: must be in 1..{layers} (the source's layer count)")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.cli.fit import init_distributed
    from rf_eval.devices import default_device, parse_dtype
    from rf_eval.rarecache.fit import fit_transfer
    from rf_eval.rarecache.maps import check_tokenizers
    from rf_eval.ridge.calibration import CalibrationError, check_nonempty

    remote = dict(trust_remote_code=args.trust_remote_code)
    check_inputs(args)
    try:
        check_nonempty(args.calibration)
        source_tok = AutoTokenizer.from_pretrained(args.source, **remote)
        target_tok = AutoTokenizer.from_pretrained(args.target, **remote)
        check_tokenizers(source_tok, target_tok)  # before any weights load
        init_distributed()
        device = args.device or default_device()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        dtype = parse_dtype(args.dtype, device)
        source, target = (
            AutoModelForCausalLM.from_pretrained(p, dtype=dtype, **remote).to(device).eval()
            for p in (args.source, args.target)
        )
        maps, path = fit_transfer(source, target, source_tok, target_tok, args.calibration, k=args.k,
                                  rank=args.rank, lam=args.lam, stride=args.stride, max_tokens=args.max_tokens,
                                  out=args.out, progress=not args.no_progress, sums_device=args.sums_device)
    except (ValueError, CalibrationError, OSError) as err:
        raise UserError(str(err)) from err
    if path is not None:
        import json

        r2 = json.loads(maps.metadata["r2"])
        means = {s: sum(v["r2_k"] for v in r2[s].values()) / len(r2[s]) for s in r2}
        print(f"{maps.metadata['rows']} calibration rows, k={args.k}, rank={args.rank}, lambda={args.lam:g}; "
              f"mean in-sample R²_K key {means['key']:.4f}, value {means['value']:.4f} -> {path}")
    return 0
