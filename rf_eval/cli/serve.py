"""`rf-eval serve --model DIR [arm options] [--host 127.0.0.1 --port N]`: the reference backend behind
an OpenAI-compatible server (completions, chat completions, streaming).

The server is the lm-eval adapter built from model_args, running RidgeFill by
default, else the prefill method `method=` names (`rf_eval.methods`:
`--model-args method=rarecache,source=...,maps=...`, `method=gemfilter`, or a
plug-in's name; `rf-eval methods` lists them) (HFLM loads the models; the
adapter checks its arm, renders chat prompts and tokenizes). The
arm options (or model_args) set the server's own arm. A request may run
another arm of the same method on the same server start with
the body field `rf_arm` (e.g. `{"fill": "identity", "tail": 256}`, or
`{"rho": 0.5}` for RaReCache) or the URL prefix `/arm/fill=identity;tail=256/v1/...`.
Requests are logged as JSON lines (arm, prompt length, prefill and prompt
time) to --request-log, or to stdout. The port is bound before the model
loads (a port in use fails at once); a bad request is a 400 naming the field;
a stream the client drops is logged (status 499). Needs the `serve` extra
(`pip install 'rf-eval[serve]'`).

Requests queue in a first-come-first-served dynamic batching scheduler
(RaReCache appendix B.3): when the model is idle, up to --max-batch queued
requests (default 32, the paper's), oldest first, are served as one batch.
Prompts of one arm and one length in a batch share one prefill call (run
together where the engine can: RidgeFill arms without a selector, and plain
prompts through one stock forward; RaReCache, droppers and selector arms
prefill one by one inside it); first tokens and decoding then run request by
request, oldest first. --max-batch 1 serves one request at a time, in arrival
order. `rf-eval load` drives it with Poisson arrivals.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rf_eval.cli import UserError
from rf_eval.cli.values import port, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="model folder or hub id (the adapter's `pretrained`; or pretrained= in --model-args)")
    p.add_argument("--tokenizer", default=None, help="another tokenizer folder or id")
    arm = p.add_argument_group("arm (the server's own; a request may override any of these)")
    from rf_eval.fills import FILL_OFF, arm_fills

    arm.add_argument("--fill", default=None,
                     help=f"{' | '.join(arm_fills())} (RidgeFill; default {FILL_OFF}: fill off; `rf-eval fills` "
                          "lists the methods)")
    arm.add_argument("--maps", default=None, help="maps folder or file written by `rf-eval fit` (loaded once)")
    arm.add_argument("--split", type=positive_int, default=None, help="first filled layer (default: the maps' split, else L/2)")
    arm.add_argument("--tail", type=positive_int, default=None, help="last prompt rows kept exact (default 4096)")
    arm.add_argument("--chunk-size", type=positive_int, default=None, help="lower layers run in chunks of this many rows")
    arm.add_argument("--model-args", default=None, metavar="K=V,...",
                     help="any other model_args of the method's adapter (as for lm_eval --model_args); "
                          "method=NAME serves that prefill method (`rf-eval methods` lists them), e.g. "
                          "method=rarecache,source=...,maps=... serves RaReCache")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-length", type=positive_int, default=None, help="prompt + generation limit (default: the model's)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--served-model-name", default=None, help="the `model` name /v1/models reports")
    p.add_argument("--request-log", default=None, metavar="FILE", help="append request records (JSONL) here")
    p.add_argument("--max-batch", type=positive_int, default=32,
                   help="most queued requests served as one batch, oldest first (default 32, RaReCache B.3's "
                        "FCFS scheduler; prompts of one arm and length share a prefill call, decoding runs request "
                        "by request; 1: one request at a time)")


def model_args_from(args: argparse.Namespace) -> dict[str, Any]:
    """The server's model_args: --model-args with the flags over them (a server of a method that takes a fill
    defaults to fill=exact). The adapter checks them once, before any weights load (`Backend.from_model_args`)."""
    from lm_eval.utils import simple_parse_args_string

    from rf_eval.fills import FILL_OFF
    from rf_eval.methods import chosen_method

    given = {"pretrained": args.model, "tokenizer": args.tokenizer, "fill": args.fill, "maps": args.maps,
             "split": args.split, "tail": args.tail, "chunk_size": args.chunk_size, "device": args.device,
             "dtype": args.dtype, "max_length": args.max_length, "trust_remote_code": args.trust_remote_code or None}
    merged = {**simple_parse_args_string(args.model_args or ""), **{k: v for k, v in given.items() if v is not None}}
    if not merged.get("pretrained"):
        raise UserError("rf-eval serve needs a model: --model DIR (or pretrained=DIR in --model-args)")
    if "fill" in chosen_method(merged, "ridgefill")[0].arm_fields():
        merged.setdefault("fill", FILL_OFF)
    return merged


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from rf_eval.serving.app import RequestLog, create_app
    except ImportError as err:
        raise UserError(f"rf-eval serve needs the serve extra ({err.name} is missing): pip install 'rf-eval[serve]'") from None
    from rf_eval.serving.backend import Backend

    model_args = model_args_from(args)
    sock = bind(args.host, args.port)  # a port in use fails now, not after the model has loaded
    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    try:
        backend = Backend.from_model_args(model_args, served_name=args.served_model_name, max_batch=args.max_batch)
    except (ValueError, OSError) as err:  # bad model_args (checked before the weights), maps or model folder
        sock.close()
        what = "" if isinstance(err, UserError) else f"cannot load {model_args['pretrained']!r}: "
        raise UserError(f"{what}{err}") from None
    app = create_app(backend, RequestLog(args.request_log, None if args.request_log else sys.stdout))
    print(f"rf-eval serve: {backend.served_name} on http://{args.host}:{args.port}/v1 "
          f"(arm {backend.default_arm.info}, max batch {backend.scheduler.max_batch})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    return 0


def bind(host: str, port: int):
    """A listening socket on (host, port), bound before anything slow happens; a UserError if it is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock
