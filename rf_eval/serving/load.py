"""Time to first token under load: RaReCache's serving protocol (section 4.6, appendix B.3).

Per prompt length and request rate lambda, each arm gets one *sweep*: `requests`
streamed completions whose arrivals follow a homogeneous Poisson process of
rate lambda (exponential gaps drawn from `numpy.random.default_rng(seed)`: the
same draws for every sweep, scaled by 1/lambda, so both arms of a rate see the
identical arrival trace). Each request is sent from its own thread at its
scheduled arrival, so arrivals never wait for responses. TTFT is wall clock:
the arrival of the first streamed chunk that carries a token minus the
request's *scheduled* arrival (queueing, prefill and any lateness of the client
in sending all count), and beside it the same less the time the server spent in a second model's prefill
(`source_seconds`: RaReCache's source, which the paper's section 4.6 measurement assumes already ran; 0 for
every other method), both reported. The first `discard` requests of a sweep (by arrival)
are left out of its statistics, the paper's warm-up of the queue; the median
and the 99th percentile of the rest are numpy's `percentile` with
`method="linear"` (numpy's default). A sweep ends when every request has its
answer, or at `max_seconds` of wall clock: then no further request is sent,
requests still waiting are cut (their connections shut, so `rf-eval serve`
drops them from its queue), and the statistics cover the completed requests
only, a lower bound, marked `cut`. Per request the result keeps its scheduled,
sent, first-token and end times, so a report can recompute everything.

Saturation throughput (eq. 10): with the server idle, `5 * max_batch` requests
of the arm are sent at once; from the batch records the server returns
(`rf_batch` of `rf-eval serve`), mu = 3 * max_batch / (end of the third -
start of the first) of the first three consecutive full batches, on the
server's clock. Offered load u = lambda / mu of arm A (the paper's target).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rf_eval.serving.client import Server, ServerError
from rf_eval.serving.inflight import InFlight
from rf_eval.serving.timing import TimedArm, request_body

PERCENTILE_METHOD = "linear"  # numpy.percentile's default (Hyndman & Fan type 7)
SATURATION_BATCHES = 5  # a burst of this many full batches: room for three consecutive full ones after the
# first batches, dispatched while the rest of the burst still arrives, run part-full


def arrival_times(rate: float, n: int, seed: int) -> np.ndarray:
    """The scheduled arrivals (seconds from the sweep's start) of `n` requests of a Poisson process of `rate`
    requests per second: cumulative sums of exponential gaps of mean 1/rate, from `default_rng(seed)`."""
    if not rate > 0 or not np.isfinite(rate):
        raise ValueError(f"rate must be a finite number > 0, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0, size=int(n)) / float(rate)
    return np.cumsum(gaps)


def ttft_stats(ttfts: list[float | None], discard: int) -> dict[str, Any]:
    """Median and 99th percentile of `ttfts` (in arrival order; None: no first token) after the first `discard`."""
    kept = [t for t in ttfts[discard:] if t is not None]
    if not kept:
        return {"n": 0, "median_seconds": None, "p99_seconds": None, "mean_seconds": None}
    median, p99 = np.percentile(np.asarray(kept, dtype=float), [50, 99], method=PERCENTILE_METHOD)
    return {"n": len(kept), "median_seconds": float(median), "p99_seconds": float(p99),
            "mean_seconds": float(np.mean(kept))}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def scheduler_state(server: Server) -> dict[str, Any] | None:
    """The scheduler record of `rf-eval serve`'s /rf/info, or None from another server."""
    try:
        info = server.request("GET", "//rf/info")
    except ServerError:
        return None
    state = info.get("scheduler") if isinstance(info, dict) else None
    return state if isinstance(state, dict) else None


def wait_idle(server: Server, timeout: float, poll: float = 0.05) -> bool:
    """Wait until the server's queue is empty and no batch runs (True), or `timeout` passes (False). A server
    without a scheduler record counts as idle."""
    deadline = time.perf_counter() + timeout
    while True:
        state = scheduler_state(server)
        if state is None or (not state.get("queued") and not state.get("running")):
            return True
        if time.perf_counter() >= deadline:
            return False
        time.sleep(poll)


def sweep(server: Server, body: dict[str, Any], rate: float, n: int, discard: int, max_seconds: float,
          seed: int) -> dict[str, Any]:
    """One arm at one rate: `n` Poisson arrivals, each request streamed; see the module docstring."""
    times = arrival_times(rate, n, seed)
    run = InFlight(server, body, n)
    for i, at in enumerate(times):
        run.records[i]["scheduled"] = float(at)
    deadline = run.start + max_seconds
    for i, at in enumerate(times):
        due = run.start + float(at)
        if due >= deadline:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        run.send(i)
    cut = run.wait(deadline)
    wall = time.perf_counter() - run.start
    records = run.records
    for rec in records:
        if rec["status"] == "completed":
            rec["ttft"] = rec["first_token"] - rec["scheduled"]
            rec["ttft_without_source"] = rec["ttft"] - float((rec.get("server") or {}).get("source_seconds") or 0.0)
    counts = {s: sum(r["status"] == s for r in records) for s in ("completed", "cut", "failed", "unsent")}
    cut = cut or counts["unsent"] > 0  # the deadline came before the last arrival, or before the last answer
    stats = ttft_stats([r.get("ttft") for r in records], discard)
    without = ttft_stats([r.get("ttft_without_source") for r in records], discard)
    stats.update({f"{k}_without_source": without[k] for k in ("median_seconds", "p99_seconds", "mean_seconds")})
    kept_batches = {r["batch"]["id"]: r["batch"]["size"] for r in records[discard:]
                    if r["status"] == "completed" and r.get("batch")}
    return {"rate": rate, "requests": n, "discard": discard, "sent": n - counts["unsent"], **counts,
            "cut_at_deadline": cut, "wall_seconds": wall, "max_seconds": max_seconds, **stats,
            "mean_batch_size": float(np.mean(list(kept_batches.values()))) if kept_batches else None,
            "records": records}


def saturation(server: Server, body: dict[str, Any], max_batch: int, max_seconds: float) -> dict[str, Any]:
    """Eq. 10: `SATURATION_BATCHES * max_batch` requests at once; mu from three consecutive full batches."""
    n = SATURATION_BATCHES * max_batch
    run = InFlight(server, body, n)
    go = threading.Event()
    for i in range(n):
        run.records[i]["scheduled"] = 0.0
        run.send(i, go)
    run.start = time.perf_counter()
    go.set()
    cut = run.wait(run.start + max_seconds)
    batches: dict[int, dict[str, Any]] = {}
    for rec in run.records:
        b = rec.get("batch") if rec["status"] == "completed" else None
        if not b or not isinstance(b.get("finished"), (int, float)):
            continue
        entry = batches.setdefault(b["id"], {"id": b["id"], "size": b["size"], "started": b["started"],
                                             "ended": b["finished"], "ours": 0})
        entry["ended"] = max(entry["ended"], b["finished"])
        entry["ours"] += 1
    ordered = [batches[k] for k in sorted(batches)]
    out: dict[str, Any] = {"sent": n, "max_batch": max_batch, "cut_at_deadline": cut, "batches": ordered,
                           "mu": None, "window": None,
                           "completed": sum(r["status"] == "completed" for r in run.records)}
    for k in range(len(ordered) - 2):
        three = ordered[k : k + 3]
        ids = [b["id"] for b in three]
        if ids == list(range(ids[0], ids[0] + 3)) and all(b["size"] == b["ours"] == max_batch for b in three):
            seconds = three[2]["ended"] - three[0]["started"]
            out.update(mu=3 * max_batch / seconds if seconds > 0 else None, window=ids, seconds=seconds)
            break
    else:
        out["reason"] = (f"no three consecutive full batches of {max_batch} among the {len(ordered)} batches the "
                         f"{n} requests were served in (sizes {[b['size'] for b in ordered]}): the queue did not "
                         "stay full (longer prompts, or a smaller --max-batch on the server)")
    return out


@dataclass(frozen=True)
class LoadSettings:
    """The options of one load test (`rf-eval load`'s): the sweeps' rates and sizes, what each request sends,
    and whether each arm's saturation throughput is measured first."""

    rates: tuple[float, ...]
    requests: int  # per sweep
    discard: int  # first requests of a sweep left out of its statistics
    max_seconds: float  # wall-time bound of each sweep and saturation burst
    seed: int  # of the arrival gaps
    warmup: int = 1  # untimed requests of each arm per length, one at a time, first
    max_tokens: int = 1
    model: str | None = None
    arm_field: str = "rf_arm"  # the body field the arms are sent in
    with_saturation: bool = False
    unequal_batching: bool = False  # time arms that batch differently as the server runs them (else refused)


def check_batching(arms: tuple[TimedArm, TimedArm], together: dict[str, Any], max_batch: int | None, length: int,
                   allowed: bool) -> dict[str, str]:
    """Each arm's batching on this server ("together": a batch's prompts share one forward; "one by one";
    "unbatched" on a server of max batch 1), from the warm-up's `rf_timings.prefills_together`. On a server
    batching more than one request, arms that batch differently time the server's batching rather than their
    prefills (exact's prompts share a forward while RaReCache's, the droppers' and row selectors' run one after
    another): refused unless `allowed`, naming the fair comparison, both arms unbatched (`rf-eval serve
    --max-batch 1`). Why unbatched rather than batched: those methods choose rows per prompt, so a batch of them
    has a different causal pattern per prompt, which the engine's one batched forward does not carry."""
    if max_batch == 1:
        return {"a": "unbatched", "b": "unbatched"}
    said = {side: ("together" if flag else "one by one") if isinstance(flag, bool) else "unknown"
            for side, flag in together.items()}
    if isinstance(max_batch, int) and max_batch > 1 and len(set(said.values())) > 1 and not allowed:
        names = {side: arm.name for side, arm in zip("ab", arms)}
        raise ServerError(
            f"at {length:,} tokens arm A ({names['a']}) prefills a batch's prompts {said['a']} and arm B "
            f"({names['b']}) {said['b']}: on this server (max batch {max_batch}) the load test would time the "
            "batching, not the two prefills. Restart the server with `rf-eval serve ... --max-batch 1` (both arms "
            "unbatched), or pass --unequal-batching to time them as the server runs them")
    return said


def measure(server: Server, arms: tuple[TimedArm, TimedArm], prompts: dict[int, list[int]], settings: LoadSettings,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The protocol over `prompts` ({length: token ids}) and the settings' rates; the results object (JSON-ready)."""
    state = scheduler_state(server)
    max_batch = state.get("max_batch") if state else None
    if settings.with_saturation and not isinstance(max_batch, int):
        raise ServerError(f"{server.base_url} reports no batching scheduler (/rf/info `scheduler`): --saturation "
                          "needs `rf-eval serve`'s batch records")
    run = _LoadRun(server, arms, settings, progress or (lambda message: None))
    for length, ids in prompts.items():
        run.length(length, ids, max_batch)
    return run.results(state)


class _LoadRun:
    """One load test under way: its server, arms and settings, and the results gathered so far."""

    def __init__(self, server: Server, arms: tuple[TimedArm, TimedArm], settings: LoadSettings,
                 say: Callable[[str], None]):
        self.server, self.arms, self.settings, self.say = server, arms, settings, say
        self.lengths: list[dict[str, Any]] = []
        self.sweeps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []

    def length(self, length: int, ids: list[int], max_batch: int | None) -> None:
        """One prompt length: the warm-up, each arm's saturation if asked, then each rate's sweep of each arm."""
        server, arms, settings = self.server, self.arms, self.settings
        bodies = {side: request_body(arm, ids, settings.max_tokens, settings.model, settings.arm_field)
                  for side, arm in zip("ab", arms)}
        together: dict[str, Any] = {}
        for side in "ab":  # the warm-up, and at least one request that says how the arm batches
            for _ in range(max(settings.warmup, 1 if isinstance(max_batch, int) else 0)):
                last = server.stream_completion(bodies[side]).last or {}
                together[side] = (last.get("rf_timings") or {}).get("prefills_together")
        entry: dict[str, Any] = {"length": length, "prompt_tokens": len(ids),
                                 "batching": check_batching(arms, together, max_batch, length,
                                                            settings.unequal_batching)}
        if settings.with_saturation:
            for side, arm in zip("ab", arms):
                wait_idle(server, settings.max_seconds)
                entry[f"saturation_{side}"] = sat = saturation(server, bodies[side], int(max_batch),
                                                               settings.max_seconds)
                self.say(f"N={length} {arm.name}: mu = {sat['mu']} req/s" if sat["mu"] is not None
                         else f"N={length} {arm.name}: mu not measured: {sat['reason']}")
        mu_a = (entry.get("saturation_a") or {}).get("mu")
        self.lengths.append(entry)
        for rate in settings.rates:
            self.rows.append(self._rate(length, rate, bodies, mu_a))

    def _rate(self, length: int, rate: float, bodies: dict[str, dict[str, Any]], mu_a: float | None
              ) -> dict[str, Any]:
        """One rate's sweep of each arm; its row of the results table."""
        server, settings = self.server, self.settings
        row: dict[str, Any] = {"length": length, "rate": rate, "u": _ratio(rate, mu_a)}
        for side, arm in zip("ab", self.arms):
            wait_idle(server, settings.max_seconds)
            result = sweep(server, bodies[side], rate, settings.requests, settings.discard, settings.max_seconds,
                           settings.seed)
            self.sweeps.append({"length": length, "arm": side, "name": arm.name, "rf_arm": arm.fields, **result})
            row[side] = {k: result[k] for k in ("sent", "completed", "cut", "failed", "unsent", "n",
                                                "median_seconds", "p99_seconds", "mean_seconds",
                                                "median_seconds_without_source", "p99_seconds_without_source",
                                                "mean_batch_size", "cut_at_deadline")}
            self.say(f"N={length} rate={rate:g} {arm.name}: {result['completed']}/{result['sent']} completed, median "
                     f"{_ms(result['median_seconds'])} ms, p99 {_ms(result['p99_seconds'])} ms"
                     + (" (cut at --max-seconds)" if result["cut_at_deadline"] else ""))
        row["ratio_median"] = _ratio(row["a"]["median_seconds"], row["b"]["median_seconds"])
        row["ratio_p99"] = _ratio(row["a"]["p99_seconds"], row["b"]["p99_seconds"])
        return row

    def results(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """The results object: the settings, the protocol in words, and the lengths, rows and sweeps."""
        arms, settings = self.arms, self.settings
        return {"kind": "rf-eval-load", "version": 1, "base_url": self.server.base_url,
                "arms": {"a": arms[0].name, "b": arms[1].name},
                "rf_arms": {"a": arms[0].fields, "b": arms[1].fields}, "rates": list(settings.rates),
                "requests": settings.requests, "discard": settings.discard, "max_seconds": settings.max_seconds,
                "seed": settings.seed, "warmup": settings.warmup, "max_tokens": settings.max_tokens,
                "server_scheduler": state,
                "protocol": {"arrivals": "homogeneous Poisson: cumulative exponential gaps, "
                                         "numpy.random.default_rng(seed).exponential(1.0, requests) / rate",
                             "ttft": "first streamed token (client clock) minus the scheduled arrival",
                             "ttft_without_source": "the same less the server's source_seconds (a second model's "
                                                    "prefill, RaReCache's, which its section 4.6 assumes ran)",
                             "batching": "as the server batches: exact prompts of one length share one forward; "
                                         "a method with per-prompt parts (RaReCache, the droppers, row selectors) "
                                         "prefills its batch's prompts one after another (rf_batch records it). "
                                         "Arms that batch differently are compared only on a server of max "
                                         "batch 1 (both unbatched) unless unequal_batching",
                             "unequal_batching": settings.unequal_batching,
                             "statistics": f"after the first `discard` requests by arrival, completed requests only; "
                                           f"numpy.percentile(method={PERCENTILE_METHOD!r}) at 50 and 99",
                             "ratio": "arm A / arm B (> 1: B is faster)",
                             "saturation": "eq. 10: 3 * max_batch / (end of the third - start of the first of three "
                                           "consecutive full batches), server clock",
                             "u": "rate / mu of arm A"},
                "lengths": self.lengths, "rows": self.rows, "sweeps": self.sweeps}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f}"


def format_table(result: dict[str, Any]) -> str:
    def times(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    def done(side: dict[str, Any]) -> str:
        return f"{side['completed']}/{side['sent']}" + ("*" if side["cut_at_deadline"] else "")

    a, b = result["arms"]["a"], result["arms"]["b"]
    lines = [f"A = {a}   B = {b}   ({result['requests']} requests per sweep, first {result['discard']} discarded; "
             f"TTFT = first token - scheduled arrival; percentiles: numpy {PERCENTILE_METHOD!r})"]
    for entry in result["lengths"]:
        batching = entry.get("batching") or {}
        if len(set(batching.values())) > 1:
            lines.append(f"batching, N={entry['length']}: A prefills a batch's prompts {batching['a']}, B "
                         f"{batching['b']} (--unequal-batching: the times include the server's batching)")
        if "saturation_a" in entry:
            mus = [entry[f"saturation_{s}"]["mu"] for s in "ab"]
            lines.append(f"saturation (eq. 10), N={entry['length']}: mu(A) = "
                         + "   mu(B) = ".join("-" if m is None else f"{m:.2f} req/s" for m in mus))
    lines.append(f"{'N':>7} {'rate/s':>8} {'u':>6} {'A done':>9} {'A med ms':>9} {'A p99 ms':>9} {'B done':>9} "
                 f"{'B med ms':>9} {'B p99 ms':>9} {'A/B med':>8} {'A/B p99':>8}")
    for r in result["rows"]:
        u = "-" if r["u"] is None else f"{r['u']:.2f}"
        lines.append(f"{r['length']:>7} {r['rate']:>8g} {u:>6} {done(r['a']):>9} {_ms(r['a']['median_seconds']):>9} "
                     f"{_ms(r['a']['p99_seconds']):>9} {done(r['b']):>9} {_ms(r['b']['median_seconds']):>9} "
                     f"{_ms(r['b']['p99_seconds']):>9} {times(r['ratio_median']):>8} {times(r['ratio_p99']):>8}")
    for r in result["rows"]:
        for side in "ab":
            own, less = r[side].get("median_seconds"), r[side].get("median_seconds_without_source")
            if own is not None and less is not None and less < own:
                lines.append(f"{side.upper()} at N={r['length']}, rate {r['rate']:g}: without the source model's "
                             f"prefill (section 4.6's TTFT) median {_ms(less)} ms, p99 "
                             f"{_ms(r[side]['p99_seconds_without_source'])} ms")
    if any(r[s]["cut_at_deadline"] for r in result["rows"] for s in "ab"):
        lines.append("* cut at --max-seconds: statistics over the completed requests only (a lower bound)")
    return "\n".join(lines)

