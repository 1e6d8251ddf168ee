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
    from rf_eval.engine import Plan, plain_prefill, prefill
    from rf_eval.maps import identity_fill

    try:
        rf = RidgeFill.from_pretrained(args.model, maps=args.maps, split=args.split, device=args.device,
                                       dtype=args.dtype, fill="ridge" if args.maps else "exact")
    except ValueError as err:
        raise UserError(str(err)) from err
    fill_fns = {"identity": identity_fill, "ridge": rf._fill}
    fills = [f for f in args.fills if f != "ridge" or args.maps]
    gen = torch.Generator().manual_seed(args.seed)
    failures = 0
    for n in args.lengths:
        ids = torch.randint(0, rf.model.config.vocab_size, (1, n), generator=gen).to(rf.device)
        ref = plain_prefill(rf.model, ids)
        # fill switched off: the exact fill at the shortest tail, and every fill with the tail covering the prompt
        plans = [Plan(rf.plan.split, tail=1, fill="exact")] + [Plan(rf.plan.split, tail=n, fill=f) for f in fills]
        for plan in plans:
            diff = compare(prefill(rf.model, ids, plan, fill=fill_fns.get(plan.fill)), ref)
            failures += diff is not None
            status = "OK  " if diff is None else "FAIL"
            print(f"{status} N={n} fill={plan.fill} tail={plan.tail}: {diff or 'bitwise equal'}")
    return 1 if failures else 0
