"""`rf-eval check-equivalence`: the engine with the fill off against the plain model (recipe step 4).

Exits 1 on any bitwise difference in last-row logits or in any cache tensor.
"""

from __future__ import annotations

import argparse

import torch

from rf_eval.cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--maps", default=None, help="maps folder or file (checked against the model)")
    p.add_argument("--split", type=int, default=None)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 512])
    p.add_argument("--fills", nargs="+", default=["exact", "nofill", "identity", "ridge"],
                   help="fills to check with the tail covering the whole prompt")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a cache holds, in a fixed order (K/V, conv and recurrent states)."""
    out = []
    for layer in cache.layers:
        for name in ("keys", "values", "conv_states", "recurrent_states"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def compare(a, b) -> str | None:
    """None when two prefill results are bitwise equal, else what differs."""
    if not torch.equal(a.logits, b.logits):
        return f"logits differ (max abs {float((a.logits - b.logits).abs().max()):.3g})"
    ta, tb = cache_tensors(a.cache), cache_tensors(b.cache)
    if len(ta) != len(tb):
        return f"cache holds {len(ta)} tensors, plain model {len(tb)}"
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x.shape != y.shape or not torch.equal(x, y):
            return f"cache tensor {i} differs"
    return None


def run(args: argparse.Namespace) -> int:
    from rf_eval.api import RidgeFill
    from rf_eval.engine import Plan, plain_prefill

    fills = [f for f in args.fills if f != "ridge" or args.maps]
    try:
        rf = RidgeFill.from_pretrained(args.model, maps=args.maps, split=args.split, device=args.device,
                                       dtype=args.dtype, fill="ridge" if args.maps else "exact")
    except ValueError as err:
        raise UserError(str(err)) from err
    vocab = rf.model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    failures = 0
    for n in args.lengths:
        ids = torch.randint(0, vocab, (1, n), generator=gen).to(rf.device)
        ref = plain_prefill(rf.model, ids)
        for fill in fills:
            for plan in (Plan(rf.plan.split, tail=n, fill=fill), Plan(rf.plan.split, tail=1, fill="exact")):
                if plan.fill != fill:
                    continue
                if fill in ("identity", "ridge"):
                    rf_fill = rf._fill if fill == "ridge" else (lambda layer, x: x)
                else:
                    rf_fill = None
                from rf_eval.engine import prefill

                got = prefill(rf.model, ids, plan, fill=rf_fill)
                diff = compare(got, ref)
                status = "OK  " if diff is None else "FAIL"
                failures += diff is not None
                print(f"{status} N={n} fill={fill} tail={plan.tail}: {diff or 'bitwise equal'}")
    return 1 if failures else 0
