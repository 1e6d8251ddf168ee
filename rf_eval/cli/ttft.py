"""`rf-eval ttft --base-url URL --lengths 9216 16384 --prompt FILE [--arm-a JSON --arm-b JSON]
[--repeats 5 --warmup 1] [--out FILE]`: time to first token of two arms on one server start.

The paper's protocol (sections 3.4, 4.4, 5.3; see `rf_eval.serving.timing`):
per length a warm-up request of each arm, then `--repeats` timed requests
alternating A and B; the median per arm and the speedup as the ratio of the
medians, median(A) / median(B), without intervals. Client-side time to first
token from streamed responses; the server's prompt time where it reports it.
Each prompt is the first N tokens of --prompt under the server's tokenizer
(its /tokenize endpoint; else --tokenizer). Arms are sent as the request field
`rf_arm` (`rf-eval serve`; --arm-field names another, e.g. `vllm_xargs` for a
vLLM fork that reads its switch there); `none` sends no field (the server's own arm).
With a server that is not `rf-eval serve` (a vLLM or llama.cpp fork), give
--layers/--split/--tail of arm B for the ceiling, and switch off prefix
caching on that server (repeated prompts would be served from its cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from rf_eval.cli import UserError
from rf_eval.cli.values import nonnegative_int, positive_float, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000 (or .../v1)")
    p.add_argument("--arm-a", default='{"fill": "exact"}', help='reference arm: JSON or k=v;k=v (default {"fill": "exact"})')
    p.add_argument("--arm-b", default="none", help="timed arm (default none: the server's own arm)")
    p.add_argument("--name-a", default=None, help="name of arm A in the results")
    p.add_argument("--name-b", default=None, help="name of arm B in the results")
    p.add_argument("--lengths", type=positive_int, nargs="+", required=True, help="prompt lengths in tokens")
    p.add_argument("--prompt", required=True, metavar="FILE", help="text file the prompts are cut from")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed requests per arm and length (default 5)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed requests per arm and length first (default 1)")
    p.add_argument("--max-tokens", type=positive_int, default=1, help="tokens generated per request (default 1)")
    p.add_argument("--timing", choices=("client", "server"), default="client",
                   help="which times the speed rows use (both are recorded; default client)")
    p.add_argument("--model", default=None, help="`model` field of the requests")
    p.add_argument("--arm-field", default="rf_arm",
                   help="body field the arms are sent in (default rf_arm; e.g. vllm_xargs for a vLLM fork)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder/id, when the server has no /tokenize")
    p.add_argument("--layers", type=positive_int, default=None, help="arm B's L, for servers that do not report it")
    p.add_argument("--split", type=positive_int, default=None, help="arm B's S, for servers that do not report it")
    p.add_argument("--tail", type=positive_int, default=None, help="arm B's T, for servers that do not report it")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per request")
    p.add_argument("--out", default=None, metavar="FILE", help="write the results JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an --out file rf-eval did not write")
    p.add_argument("--quiet", action="store_true", help="no per-request lines")


def cut_prompts(server, text: str, lengths: list[int], tokenizer: str | None) -> dict[int, list[int]]:
    tokens = server.tokenize(text)
    if tokens is None:
        if tokenizer is None:
            raise UserError(f"{server.base_url} has no /tokenize endpoint: give --tokenizer (the server model's)")
        from transformers import AutoTokenizer

        tokens = AutoTokenizer.from_pretrained(tokenizer)(text)["input_ids"]
    if max(lengths) > len(tokens):
        raise UserError(f"--prompt holds {len(tokens)} tokens under the server's tokenizer; --lengths asks for "
                        f"{max(lengths)}: give a longer prompt file")
    return {n: list(tokens[:n]) for n in lengths}


def server_and_arms(args: argparse.Namespace) -> tuple:
    """The server of `--base-url` and the two arms `--arm-a/--arm-b` (named by `--name-a/--name-b`), as
    `ttft` and `load` both take them; a bad arm or URL is a UserError."""
    from rf_eval.serving.arms import ArmError
    from rf_eval.serving.client import Server
    from rf_eval.serving.timing import parse_arm

    try:
        arm_a, arm_b = parse_arm(args.arm_a, "A"), parse_arm(args.arm_b, "B")
        server = Server(args.base_url, timeout=args.timeout)
    except (ArmError, ValueError) as err:
        raise UserError(str(err)) from None
    return (server, type(arm_a)(args.name_a or arm_a.name, arm_a.fields),
            type(arm_b)(args.name_b or arm_b.name, arm_b.fields))


def measure_and_write(args: argparse.Namespace, protocol: ModuleType, settings: Any, text: str,
                      lengths: list[int], prompt: dict[str, Any]) -> int:
    """What `ttft` and `load` share once their options are checked: the prompts of `lengths` cut from `text`, both
    arms measured by `protocol` (`rf_eval.serving.timing` or `.load`), the table printed, the JSON written to --out."""
    from rf_eval.files.outputs import stamp_json, write_output
    from rf_eval.serving.client import ServerError

    server, arm_a, arm_b = server_and_arms(args)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        prompts = cut_prompts(server, text, lengths, args.tokenizer)
        result = protocol.measure(server, (arm_a, arm_b), prompts, settings,
                                  None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True))
    except ServerError as err:
        raise UserError(str(err)) from None
    result.update(started=started, prompt=prompt)
    print(protocol.format_table(result))
    if args.out:
        write_output(args.out, json.dumps(stamp_json(result), indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    from rf_eval.files.outputs import check_output
    from rf_eval.serving import timing

    if args.repeats < 1 or args.warmup < 0 or args.max_tokens < 1 or min(args.lengths) < 2:
        raise UserError("--repeats and --max-tokens must be >= 1, --warmup >= 0 and every length >= 2")
    path = Path(args.prompt)
    if not path.is_file():
        raise UserError(f"--prompt {path}: no such file")
    if args.out:  # before any request: never over a file rf-eval did not write (`rf_eval.files.outputs`)
        check_output("--out", args.out, overwrite=args.overwrite)
    text = path.read_text(encoding="utf-8")
    fallback = None
    if args.layers is not None and args.split is not None and args.tail is not None:
        fallback = {"fill": "filled", "layers": args.layers, "split": args.split, "tail": args.tail}
    settings = timing.TtftSettings(repeats=args.repeats, warmup=args.warmup, max_tokens=args.max_tokens,
                                   model=args.model, fallback_arm=fallback, timing=args.timing,
                                   arm_field=args.arm_field)
    return measure_and_write(args, timing, settings, text, args.lengths,
                             {"file": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest()})
