"""`rf-eval check-equivalence`: the engine with the fill off against the plain model (recipe step 4).

Exits 1 on any bitwise difference in last-row logits or in any cache tensor.

`--base-url URL-A --base-url URL-B [--prompts FILE]`: the check across servers
(paper section 4.3, e.g. a fork with the fill off against stock): identical
greedy outputs and top-k log-probabilities on every prompt, else exit 1
(see `rf_eval.serving.equivalence`).
"""

from __future__ import annotations

import argparse

import torch

from rf_eval.cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (the in-process check)")
    p.add_argument("--maps", default=None, help="maps folder or file (checked against the model)")
    p.add_argument("--split", type=int, default=None)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 512])
    p.add_argument("--fills", nargs="+", default=["exact", "nofill", "identity", "ridge"],
                   help="fills to check with the tail covering the whole prompt")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    remote = p.add_argument_group("across servers")
    remote.add_argument("--base-url", action="append", default=[], metavar="URL",
                        help="an OpenAI-compatible server; give two (or more): each is compared with the first")
    remote.add_argument("--prompts", default=None, metavar="FILE",
                        help=".jsonl/.json list of prompts (strings or token lists), or a text file (one prompt)")
    remote.add_argument("--arm", action="append", default=None, metavar="JSON",
                        help="rf_arm sent to each server in order (`none`: no field; default none)")
    remote.add_argument("--max-tokens", type=int, default=16, help="greedy tokens per prompt (default 16)")
    remote.add_argument("--top-logprobs", type=int, default=10, help="top-k log-probabilities compared (default 10)")


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a cache holds, in a fixed order (K/V, conv and recurrent states)."""
    out = []
    for layer in cache.layers:
        for name in ("keys", "values", "conv_states", "recurrent_states"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(value, dict):  # linear-attention layers keep their states per state index
                out.extend(value[k] for k in sorted(value) if isinstance(value[k], torch.Tensor))
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
    if args.base_url:
        return run_servers(args)
    if args.model is None:
        raise UserError("give --model (in-process check) or two --base-url (across servers)")
    from rf_eval.engine import Plan, plain_prefill, prefill
    from rf_eval.ridgefill.api import RidgeFill
    from rf_eval.ridgefill.maps import identity_fill

    try:
        rf = RidgeFill.from_pretrained(args.model, maps=args.maps, split=args.split, device=args.device,
                                       dtype=args.dtype, fill="ridge" if args.maps else "exact")
    except ValueError as err:
        raise UserError(str(err)) from err
    fill_fns = {"identity": identity_fill, "ridge": rf.fill_fn}
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


def run_servers(args: argparse.Namespace) -> int:
    from rf_eval.serving.arms import ArmError, parse_spec
    from rf_eval.serving.client import Server, ServerError
    from rf_eval.serving.equivalence import check, default_prompts, load_prompts

    if len(args.base_url) < 2:
        raise UserError("the check across servers needs two --base-url")
    arms = args.arm or []
    if len(arms) not in (0, 1, len(args.base_url)):
        raise UserError(f"give one --arm, or one per --base-url ({len(args.base_url)}); got {len(arms)}")
    try:
        parsed = [None if a.strip().lower() in ("none", "") else parse_spec(a) for a in arms]
        prompts = load_prompts(args.prompts) if args.prompts else default_prompts()
        servers = [Server(url) for url in args.base_url]
        failures = check(servers, prompts, args.max_tokens, args.top_logprobs,
                         parsed * len(servers) if len(parsed) == 1 else parsed or None)
    except (ArmError, ValueError, OSError) as err:
        raise UserError(str(err)) from None
    except ServerError as err:
        raise UserError(str(err)) from None
    print(f"{'FAIL' if failures else 'OK'}: {failures} of {len(prompts)} prompts differ")
    return 1 if failures else 0
