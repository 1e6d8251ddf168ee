"""Trace one request through the package: which of its files it crosses, and how often each rule runs.

`trace(fn)` runs `fn()` under `sys.setprofile` and records every Python call
into a file of the repository (rf_eval/, model_adapters/, tasks/, ...): the
files in the order the request first enters them, the calls between files of
different folders (the request's folder hops), and how many times each of the
request path's rules ran (`RULES`). A rule is counted by every function that
decides it, whatever its name or place: the prompt's plan (plain or not, and
what runs: `Method.plan`), a decision of "plain?" or of the plan's parts made
apart from it (the names such decisions had before #53: `is_plain`,
`runs_plain`, `plan_for`, `_plan_given`, `kept_count`, `recomputed`, ...), the
rows a rule keeps, the prompt check, the method's forward context, the
prefill, the extension over the prompt's cache. `tests/test_request_path.py`
asserts each rule runs once; run this file to print a trace
(`python tests/request_trace.py`).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the rules of the request path, by the functions that decide them (a name, or a qualified name).
#: "plan built": a method's one decision per prompt (`Method.plan`: plain or not, the tail, the rows kept,
#: the recomputed rows, the knob's value); "decided apart": the same decisions made outside it, by the
#: functions that made them before #53 (a request runs none: the plan is handed on as a value); "rows chosen":
#: the rows a rule picks (a dropper's `keep_rows`, a selector called by the engine, RaReCache's chooser);
#: "forward context" counts the context's openings (`ForwardContext.open`), "forward context calls" every
#: entry, the re-entrant ones that find it open included
RULES = {
    "plan built": ("plan",),
    "decided apart": ("is_plain", "runs_plain", "plan_for", "_plan_given", "kept_count", "recomputed", "row_budget",
                      "knob_value"),
    "rows chosen": ("keep_rows", "prefill_arm.<locals>.select", "choose"),
    "prompt check": ("check_prompt",),
    "forward context": ("ForwardContext.open",),
    "forward context calls": ("forward_context",),
    "prefill": ("prefill", "prefill_batch"),
    "extend": ("extend",),
}
#: the rules a request runs once at most (the calls of the forward context may repeat: they find it open)
ONCE = ("plan built", "rows chosen", "prompt check", "forward context", "prefill", "extend")
#: the package's folders (installed as rf_eval and its subpackages); the tests' own calls are not the request's
PACKAGE = ("rf_eval/", "model_adapters/", "tasks/", "stats/", "reports/")
#: rules that are methods of a `Method` (a call counts when its `self` is one: has `prefill`)
_METHOD_RULES = ("plan", "prefill", "extend")


@dataclass
class Trace:
    """What one traced request ran (see the module docstring)."""

    files: list[str] = field(default_factory=list)  # repository files, in the order first entered
    hops: list[tuple[str, str]] = field(default_factory=list)  # (caller folder, callee folder), each distinct once
    rules: Counter = field(default_factory=Counter)  # rule -> calls (the methods' own calls of a rule included)
    callers: dict[str, list[str]] = field(default_factory=dict)  # rule -> "file:function" of each call's caller

    def folders(self) -> list[str]:
        return sorted({str(Path(f).parent) for f in self.files})

    def summary(self) -> str:
        lines = [f"{len(self.files)} files, {len(self.folders())} folders, {len(self.hops)} folder hops"]
        lines += [f"  {f}" for f in self.files]
        lines += [f"  hop {a} -> {b}" for a, b in self.hops]
        lines += [f"  {rule}: {self.rules[rule]} ({', '.join(self.callers.get(rule, []))})" for rule in RULES]
        return "\n".join(lines)


def _repo_file(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    if not rel.startswith(PACKAGE) or not rel.endswith(".py"):
        return None
    return rel


def trace(fn: Callable[[], Any]) -> tuple[Any, Trace]:
    """(fn(), the trace of the repository calls it made, in threads it starts too: the server's scheduler)."""
    out = Trace()
    tracing = [True]
    seen: set[str] = set()
    hops: set[tuple[str, str]] = set()
    names: dict[str, list[str]] = {}
    for rule, funcs in RULES.items():
        for name in funcs:
            names.setdefault(name, []).append(rule)
    cache: dict[str, str | None] = {}

    def where(frame) -> str | None:
        filename = frame.f_code.co_filename
        if filename not in cache:
            cache[filename] = _repo_file(filename)
        return cache[filename]

    def profile(frame, event, _arg):
        if not tracing[0]:
            sys.setprofile(None)  # a thread started while tracing, still running
            return
        if event != "call":
            return
        callee = where(frame)
        if callee is None:
            return
        if callee not in seen:
            seen.add(callee)
            out.files.append(callee)
        caller_frame = frame.f_back
        while caller_frame is not None and where(caller_frame) is None and caller_frame.f_back is not None:
            caller_frame = caller_frame.f_back  # through library frames (torch, lm_eval) to the repository caller
        caller = where(caller_frame) if caller_frame is not None else None
        if caller is not None:
            pair = (str(Path(caller).parent), str(Path(callee).parent))
            if pair[0] != pair[1] and pair not in hops:
                hops.add(pair)
                out.hops.append(pair)
        code = frame.f_code
        for rule in names.get(code.co_qualname, names.get(code.co_name, [])):
            if code.co_name in _METHOD_RULES and not hasattr(frame.f_locals.get("self"), "prefill"):
                continue  # an engine function (or an arm's property) of that name, not the method's
            out.rules[rule] += 1
            who = f"{caller}:{caller_frame.f_code.co_name}" if caller is not None else "outside"
            out.callers.setdefault(rule, []).append(who)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        tracing[0] = False
    return result, out


def filled_adapter(model_dir: str, **args: Any) -> Any:
    """A `--model ridgefill` adapter on a tiny model whose prompts of over 6 tokens have filled rows."""
    from rf_eval.model_adapters import prefill_lm
    return prefill_lm.ridgefill.create_from_arg_obj({"pretrained": model_dir, "device": "cpu", "fill": "identity",
                                            "tail": 6, **args})


CONTEXT = "the quick brown fox jumps over the lazy dog while the river runs past the old stone house"


def loglikelihood_request(lm: Any) -> Callable[[], Any]:
    from lm_eval.api.instance import Instance

    return lambda: lm.loglikelihood([Instance("loglikelihood", {}, (CONTEXT, " and then"), 0)], disable_tqdm=True)


def generate_request(lm: Any) -> Callable[[], Any]:
    from lm_eval.api.instance import Instance

    kwargs = {"until": ["\n\n"], "max_gen_toks": 4, "do_sample": False}
    return lambda: lm.generate_until([Instance("generate_until", {}, (CONTEXT, kwargs), 0)], disable_tqdm=True)


def served_request(lm: Any) -> Callable[[], Any]:
    """One generation through `rf-eval serve`'s model (`rf_eval.serving.backend.Backend`) over `lm`."""
    from rf_eval.serving.backend import Backend, GenParams

    backend = Backend(lm)
    ids = backend.encode(CONTEXT)
    return lambda: backend.generate(ids, backend.default_arm, GenParams(max_tokens=4))


REQUESTS = {"loglikelihood": loglikelihood_request, "generate_until": generate_request, "served": served_request}


if __name__ == "__main__":  # python tests/request_trace.py: print the traces of both requests
    import tempfile

    import torch

    from rf_eval.testing import make_tiny_model

    torch.set_num_threads(1)
    lm = filled_adapter(str(make_tiny_model("llama", tempfile.mkdtemp())))
    for name, request in REQUESTS.items():
        _, found = trace(request(lm))
        print(f"== {name}\n{found.summary()}")
