"""`rf-eval fit-transfer`: fit RaReCache's source -> target cache maps (paper section 3.1, appendix A).

    rf-eval fit-transfer --source SMALL --target LARGE --calibration FILE... \\
        [--k 8] [--rank 128] [--lambda 0.01] [--stride N] --out DIR

Under `torchrun --nproc_per_node K -m rf_eval fit-transfer ...` the documents
are sharded across processes and the sums all-reduced; rank 0 writes the file.
Memory: the fp64 sums hold, per side, a (L_s d_s)² Gram and an
(L_s d_s) x (L_t d_t) cross term (d = n_kv * d_h of one layer), whatever the
calibration size (`--sums-device cpu` keeps them in host memory). The work is
`rf_eval.rarecache.transfer_run.fit_transfer_file`'s; this module parses the options into its arguments
(the pair, calibration and `--out`) and `TransferOptions` (the rest).
"""

from __future__ import annotations

import argparse

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


def run(args: argparse.Namespace) -> int:
    from rf_eval.rarecache.transfer_run import TransferOptions, fit_transfer_file

    options = TransferOptions(k=args.k, rank=args.rank, lam=args.lam, stride=args.stride,
                              max_tokens=args.max_tokens, device=args.device, sums_device=args.sums_device,
                              dtype=args.dtype, trust_remote_code=args.trust_remote_code,
                              overwrite=args.overwrite, progress=not args.no_progress)
    fit = fit_transfer_file(args.source, args.target, args.calibration, args.out, options)
    summary = fit.summary()
    if summary is not None:
        print(summary)
    return 0
