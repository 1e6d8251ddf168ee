"""`rf-eval load --base-url URL --lengths N... --rates LAMBDA... [--arm-a JSON --arm-b JSON] [--requests 500
--discard 50 --max-seconds 600 --seed 0 --saturation] [--out FILE]`: time to first token under Poisson load.

RaReCache's serving protocol (section 4.6, appendix B.3; `rf_eval.serving.load`):
per prompt length and rate, each arm gets a sweep of --requests streamed
requests arriving as a Poisson process of that rate (seeded exponential gaps:
both arms of a rate see the identical trace), each sent from its own thread at
its scheduled time; TTFT is wall clock, first streamed token minus scheduled
arrival. The first --discard requests are left out; per arm and rate the
median and 99th percentile (numpy, linear interpolation) and the ratios
arm A / arm B. --saturation measures each arm's saturation throughput mu
(eq. 10: three back-to-back full batches of a saturated queue, from the
server's batch records, after sending 5 x its max batch requests at once) and prints the offered load u = lambda / mu(A).
--max-seconds bounds each sweep's wall time: later arrivals are not sent,
waiting requests are cut, and the sweep is marked cut. The server should be
`rf-eval serve` (its FCFS batching scheduler, --max-batch, default 32, as the
paper's); another OpenAI-compatible server works for the sweeps but not for
--saturation. Arms go in the request field `rf_arm` (--arm-field names another).
"""

from __future__ import annotations

import argparse
import hashlib
import random
from pathlib import Path

from rf_eval.cli import UserError
from rf_eval.cli.values import nonnegative_int, positive_float, positive_int

WORDS = ("harbor ledger signal copper meadow lantern orchard window candle thunder bridge canvas river stone "
         "garden silver market winter summer forest valley engine").split()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000 (or .../v1)")
    p.add_argument("--arm-a", default='{"fill": "exact"}',
                   help='reference arm (the paper\'s target; u = lambda / mu of this arm): JSON or k=v;k=v '
                        '(default {"fill": "exact"})')
    p.add_argument("--arm-b", default="none", help="compared arm (default none: the server's own arm)")
    p.add_argument("--name-a", default=None, help="name of arm A in the results")
    p.add_argument("--name-b", default=None, help="name of arm B in the results")
    p.add_argument("--lengths", type=positive_int, nargs="+", required=True, help="prompt lengths in tokens")
    p.add_argument("--rates", type=positive_float, nargs="+", required=True, metavar="LAMBDA",
                   help="request rates, requests per second (one sweep per arm and rate)")
    p.add_argument("--requests", type=positive_int, default=500, help="requests per sweep (default 500)")
    p.add_argument("--discard", type=nonnegative_int, default=50,
                   help="first requests of a sweep left out of its statistics (default 50)")
    p.add_argument("--max-seconds", type=positive_float, default=600.0,
                   help="wall-time bound of each sweep (and saturation burst): no request is sent after it, "
                        "those still waiting are cut, the sweep is marked cut (default 600)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the arrival gaps (default 0)")
    p.add_argument("--saturation", action="store_true",
                   help="measure each arm's saturation throughput mu first (eq. 10: 5 x the server's max batch "
                        "requests at once; mu = 3 x max batch / the server's time for three consecutive full "
                        "batches); prints u = lambda / mu(A). Needs `rf-eval serve`")
    p.add_argument("--unequal-batching", action="store_true",
                   help="compare arms that batch differently (exact's prompts share a forward, RaReCache's, the "
                        "droppers' and row selectors' run one by one) on a server batching several requests, as "
                        "the server runs them; refused without it (serve with --max-batch 1 to compare both "
                        "unbatched)")
    p.add_argument("--warmup", type=nonnegative_int, default=1,
                   help="untimed requests of each arm per length, one at a time, first (default 1)")
    p.add_argument("--max-tokens", type=positive_int, default=1, help="tokens generated per request (default 1)")
    p.add_argument("--prompt", default=None, metavar="FILE",
                   help="text file the prompts are cut from (default: a generated word sequence); every request "
                        "of a length sends the same prompt")
    p.add_argument("--model", default=None, help="`model` field of the requests")
    p.add_argument("--arm-field", default="rf_arm", help="body field the arms are sent in (default rf_arm)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder/id, when the server has no /tokenize")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per request")
    p.add_argument("--out", default=None, metavar="FILE", help="write the results JSON (every request's times) here")
    p.add_argument("--overwrite", action="store_true", help="replace an --out file rf-eval did not write")
    p.add_argument("--quiet", action="store_true", help="no per-sweep lines")


def default_text(n_tokens: int, seed: int) -> str:
    """A word sequence of at least `n_tokens` tokens under any tokenizer that gives each word a token or more."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens + 16))


def run(args: argparse.Namespace) -> int:
    from rf_eval.cli.ttft import measure_and_write
    from rf_eval.files.outputs import check_output
    from rf_eval.serving import load

    if min(args.lengths) < 2:
        raise UserError("every --lengths value must be >= 2 (a prompt and its last token)")
    if args.discard >= args.requests:
        raise UserError(f"--discard {args.discard} leaves none of --requests {args.requests}: give fewer discarded "
                        "requests than requests")
    if len(set(args.rates)) != len(args.rates) or len(set(args.lengths)) != len(args.lengths):
        raise UserError("--rates and --lengths must not repeat a value")
    text, prompt_record = None, None
    if args.prompt is not None:
        path = Path(args.prompt)
        if not path.is_file():
            raise UserError(f"--prompt {path}: no such file")
        text = path.read_text(encoding="utf-8")
        prompt_record = {"file": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    if args.out:  # before any request: never over a file rf-eval did not write (`rf_eval.files.outputs`)
        check_output("--out", args.out, overwrite=args.overwrite)
    if text is None:
        text = default_text(max(args.lengths), args.seed)
        prompt_record = {"generated": f"{max(args.lengths) + 16} words drawn with seed {args.seed}",
                         "sha256": hashlib.sha256(text.encode()).hexdigest()}
    settings = load.LoadSettings(rates=tuple(args.rates), requests=args.requests, discard=args.discard,
                                 max_seconds=args.max_seconds, seed=args.seed, warmup=args.warmup,
                                 max_tokens=args.max_tokens, model=args.model, arm_field=args.arm_field,
                                 with_saturation=args.saturation, unequal_batching=args.unequal_batching)
    return measure_and_write(args, load, settings, text, sorted(args.lengths), prompt_record)
