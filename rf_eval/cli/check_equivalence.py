"""`rf-eval check-equivalence`: the engine with the fill off against the plain model (recipe step 4).

For each length, three comparisons with the stock model (`plain_prefill`),
of the last row's logits and every cache tensor (RidgeFill paper sections
4.3 and 9):

- `OK`/`FAIL` lines: the fill switched off (exact fill, or the tail covering
  the prompt); these dispatch to the plain forward, so they check the dispatch.
  A fill whose rules refuse the model or --maps prints a `SKIP` line saying
  why. A fill that makes the model's forward its own (`swiftkv_released` on a
  SwiftKV checkpoint) is checked last, against that forward.
- `PASS`/`FAIL` line: the partial path itself (lower layers, a selector that
  makes every prefix row exact, late layers: `engine.partial_every_row_exact`),
  expected bitwise; a failure names the first tensor that differs.
- `NOTE` line: the same rows through the attention kernel filled arms' exact
  rows use (`engine.filled_kernel_every_row_exact`): not bitwise (masked SDPA
  over the key rows; stock uses is_causal), its max |Δ| and KL(stock || partial)
  of the last row are the floor under every filled arm's difference.

`--json PATH` saves every comparison (never over a file rf-eval did not write, unless
`--overwrite`: `rf_eval.files.outputs`). Exits 1 on any FAIL.

`--base-url URL-A --base-url URL-B [--prompts FILE]`: the check across servers
(paper section 4.3, e.g. a fork with the fill off against stock): identical
greedy outputs and top-k log-probabilities on every prompt, else exit 1
(see `rf_eval.serving.equivalence`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rf_eval.cli import UserError
from rf_eval.cli.values import nonnegative_int, positive_int
from rf_eval.devices import check_device, check_model_source, parse_dtype
from rf_eval.engine import named_cache_tensors, partial_path_floors, plain_prefill
from rf_eval.families import family_class_for
from rf_eval.fields import ArmError
from rf_eval.files.outputs import check_output, stamp_json, write_output
from rf_eval.fills import FILL_OFF, arm_fills, fill_named
from rf_eval.ridgefill.fitting import check_splits
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.serving.arms import parse_rf_arm
from rf_eval.serving.client import Server, ServerError
from rf_eval.serving.equivalence import check as check_servers
from rf_eval.serving.equivalence import default_prompts, load_prompts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (the in-process check)")
    p.add_argument("--maps", default=None, help="maps folder or file (checked against the model)")
    p.add_argument("--split", type=positive_int, default=None)
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[64, 512])
    p.add_argument("--fills", nargs="+", default=None, metavar="FILL",
                   help="fills to check with the tail covering the whole prompt (default: every fill)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="save every comparison (and the floors) as JSON")
    p.add_argument("--overwrite", action="store_true", help="replace a --json file rf-eval did not write")
    remote = p.add_argument_group("across servers")
    remote.add_argument("--base-url", action="append", default=[], metavar="URL",
                        help="an OpenAI-compatible server; give two (or more): each is compared with the first")
    remote.add_argument("--prompts", default=None, metavar="FILE",
                        help=".jsonl/.json list of prompts (strings or token lists), or a text file (one prompt)")
    remote.add_argument("--arm", action="append", default=None, metavar="JSON",
                        help="rf_arm sent to each server in order (`none`: no field; default none)")
    remote.add_argument("--max-tokens", type=positive_int, default=16, help="greedy tokens per prompt (default 16)")
    remote.add_argument("--top-logprobs", type=positive_int, default=10, help="top-k log-probabilities compared (default 10)")


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every tensor a cache holds, in a fixed order (`rf_eval.engine.named_cache_tensors`)."""

    return [tensor for _, tensor in named_cache_tensors(cache)]


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


def check_lengths(model: str, lengths: list[int]) -> None:
    """Each prompt length in 2..the model's max_position_embeddings (read from its config, before the weights):
    a floor measured past the positions a model was built for says nothing about the model."""
    from transformers import AutoConfig

    try:
        limit = getattr(AutoConfig.from_pretrained(model).get_text_config(), "max_position_embeddings", None)
    except (OSError, ValueError):
        limit = None  # the model's own loading says why
    bad = [n for n in lengths if n < 2 or (limit is not None and n > limit)]
    if bad:
        upto = f"{limit} (the model's max_position_embeddings)" if limit is not None else "the model's positions"
        raise UserError(f"--lengths {' '.join(map(str, bad))}: each length must be in 2..{upto}")


def check_inputs(args: argparse.Namespace) -> None:
    """What the in-process check can refuse before the weights load: the model folder, device, dtype, maps,
    fills, lengths and split (the last two against the model's config), and the --json file."""

    for option, check in (("--model", lambda: check_model_source(args.model)),
                          ("--device", lambda: check_device(args.device)),
                          ("--dtype", lambda: parse_dtype(args.dtype, check_device(args.device)))):
        try:
            check()
        except ValueError as err:
            raise UserError(f"{option}: {err}") from None
    if args.json:  # never over a file rf-eval did not write (`rf_eval.files.outputs`)
        check_output("--json", args.json, overwrite=args.overwrite)
    if args.maps and not Path(args.maps).expanduser().exists():
        raise UserError(f"--maps {args.maps}: no such file or folder (give the folder `rf-eval fit` wrote)")
    args.fills = list(arm_fills()) if args.fills is None else args.fills
    unknown = [f for f in args.fills if f not in arm_fills()]
    if unknown:
        raise UserError(f"--fills {' '.join(unknown)}: not a fill; valid fills: {', '.join(arm_fills())}")
    check_lengths(args.model, args.lengths)
    if args.split is not None:
        check_split(args.model, args.split)


def check_split(model: str, split: int) -> None:
    """--split in 1..L-1 of the model's L layers (from its config)."""
    from transformers import AutoConfig

    try:
        layers = AutoConfig.from_pretrained(model).get_text_config().num_hidden_layers
    except (OSError, ValueError):
        return  # the model's own loading says why
    try:
        check_splits([split], layers)
    except ValueError as err:
        raise UserError(f"--split: {err}") from None


def runnable(fill: str, rf) -> bool:
    """True when fill `fill` may run on the checked model with its --maps; else prints why not."""
    method = fill_named(fill)
    try:
        method.check(rf.model.config, rf.maps)
    except ArmError as err:
        print(f"SKIP fill={fill}: {err}")
        return False
    return True


def checked_fills(names: list[str], rf: RidgeFill) -> tuple[list[str], list[str]]:
    """(the fills to check: those whose own rules accept this model and --maps, the one of them that replaces
    the model's forward, checked last against that forward; a second such fill is skipped, saying why)."""
    fills = [f for f in names if f == FILL_OFF or runnable(f, rf)]
    later = [f for f in fills if f != FILL_OFF and fill_named(f).replaces_forward]
    for fill in later[1:]:
        print(f"SKIP fill={fill}: it replaces the model's forward, as fill={later[0]} (checked) does; check it alone "
              f"(--fills {fill})")
        fills.remove(fill)
    return fills, later[:1]


def run(args: argparse.Namespace) -> int:
    if args.base_url:
        return run_servers(args)
    if args.model is None:
        raise UserError("give --model (in-process check) or two --base-url (across servers)")

    check_inputs(args)
    try:
        rf = RidgeFill.from_pretrained(args.model, maps=args.maps, split=args.split, device=args.device,
                                       dtype=args.dtype, fill=FILL_OFF)
    except ValueError as err:
        raise UserError(str(err)) from err
    fills, later = checked_fills(args.fills, rf)
    gen = torch.Generator().manual_seed(args.seed)
    family = family_class_for(rf.model.config).__module__.rsplit(".", 1)[-1]
    where = {"family": family, "dtype": str(next(rf.model.parameters()).dtype).removeprefix("torch."),
             "split": rf.arm.split}
    failures, records, prompts = 0, [], []

    def arm_of(fill: str, tail: int | None = None) -> RidgeFill:
        """The checked model's arm of `fill` (at its own split where it has one, else the checked split)."""
        own = fill != FILL_OFF and fill_named(fill).default_split(rf.model.config) is not None
        return rf.rebuilt(rf.updated_arm({"fill": fill, "split": None if own else rf.arm.split,
                                          **({"tail": tail} if tail else {})}))

    def dispatch(ids: torch.Tensor, fill: str, tail: int, ref) -> None:
        """The arm of `fill` at `tail` prefilling `ids` (its plan: plain, the stock forward) against `ref`."""
        nonlocal failures
        diff = compare(arm_of(fill, tail).prefill(ids), ref)
        failures += diff is not None
        status = "OK  " if diff is None else "FAIL"
        print(f"{status} N={ids.shape[1]} fill={fill} tail={tail}: {diff or 'bitwise equal'}")
        records.append({**where, "length": ids.shape[1], "check": "plain dispatch", "fill": fill,
                        "tail": tail, "bitwise": diff is None, "diff": diff})

    for n in args.lengths:
        ids = torch.randint(0, rf.model.config.vocab_size, (1, n), generator=gen).to(rf.device)
        prompts.append(ids)
        ref = plain_prefill(rf.model, ids)
        # fill switched off: the exact fill at the shortest tail, and every fill with the tail covering the prompt
        for fill, tail in [(FILL_OFF, 1)] + [(f, n) for f in fills if f not in later]:
            dispatch(ids, fill, tail, ref)
        partial, kernel = partial_path_floors(rf.model, ids, rf.arm.split)
        failures += not partial.bitwise
        print(f"{'PASS' if partial.bitwise else 'FAIL'} N={n} partial path, every row exact "
              f"({family} {where['dtype']} split={rf.arm.split}): {describe(partial)}")
        print(f"NOTE N={n} filled-row kernel, every row exact: {describe(kernel)}")
        records.append({**where, "length": n, "check": "partial path, every row exact", **partial.as_dict()})
        records.append({**where, "length": n, "check": "filled-row kernel, every row exact", **kernel.as_dict()})
    for fill in later:  # a fill that makes the model's forward its own: checked against that forward, last
        arm = arm_of(fill)  # binding it installs that forward
        for ids in prompts:
            dispatch(ids, fill, ids.shape[1], plain_prefill(arm.model, ids))
    if args.json:
        write_output(args.json, json.dumps(stamp_json({"failures": failures, "comparisons": records}), indent=1))
    return 1 if failures else 0


def describe(floor) -> str:
    """One line for a `Floor`: bitwise, or max |Δ|, KL and the first tensor that differs; and why."""
    same_computation = "stock uses" not in floor.why
    if floor.bitwise:
        return f"bitwise equal ({floor.why if same_computation else 'on this prompt, though ' + floor.why})"
    return (f"max |Δ| {floor.max_abs:.3g}, KL(stock || partial) {floor.kl:.3g} nats; first differs: "
            f"{floor.first_diff} ({'expected bitwise: ' if same_computation else 'not bitwise: '}{floor.why})")


def run_servers(args: argparse.Namespace) -> int:
    if len(args.base_url) < 2:
        raise UserError("the check across servers needs two --base-url")
    arms = args.arm or []
    if len(arms) not in (0, 1, len(args.base_url)):
        raise UserError(f"give one --arm, or one per --base-url ({len(args.base_url)}); got {len(arms)}")
    try:
        parsed = [None if a.strip().lower() in ("none", "") else parse_rf_arm(a) for a in arms]
        prompts = load_prompts(args.prompts) if args.prompts else default_prompts()
        servers = [Server(url) for url in args.base_url]
        failures = check_servers(servers, prompts, args.max_tokens, args.top_logprobs,
                         parsed * len(servers) if len(parsed) == 1 else parsed or None)
    except (ArmError, ValueError, OSError) as err:
        raise UserError(str(err)) from None
    except ServerError as err:
        raise UserError(str(err)) from None
    print(f"{'FAIL' if failures else 'OK'}: {failures} of {len(prompts)} prompts differ")
    return 1 if failures else 0
