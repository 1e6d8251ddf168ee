"""The paper's time-to-first-token protocol (sections 3.4, 4.4, 5.3).

Per prompt length: `warmup` untimed requests of each arm, then `repeats`
timed requests of each arm, alternating A, B, A, B, ... on the same server
start. Per arm the median of the timed requests; the speedup of B over A is
the ratio of the medians, median(A) / median(B). No intervals. The client
side time to first token comes from streamed responses; the server's prompt
time is read where the server reports it (`rf_timings.prompt_seconds` of
`rf-eval serve`, or llama.cpp's `timings.prompt_ms`).

The ceiling is the layer-pass count of section 2.5, 1/r with
r = S/L + (1 - S/L) T/N (r = 1 for an arm without filled rows); with two
filled arms it is r(A) / r(B). The `speed` rows of the result have the shape
of the report's speed table (arm, length, n, arm_seconds, ref_seconds,
speedup, ceiling, share).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rf_eval.cost.mac_model import ceiling_r
from rf_eval.serving.arms import parse_rf_arm
from rf_eval.serving.client import Server, StreamResult


@dataclass(frozen=True)
class TimedArm:
    """One side of the comparison: a name and the `rf_arm` it sends (None: send none, the server's own arm)."""

    name: str
    fields: dict[str, Any] | None


def parse_arm(text: str | None, default_name: str) -> TimedArm:
    """`--arm-a/--arm-b` values: a JSON object, a `key=value;...` arm string, or `none`/`server`."""

    if text is None or text.strip().lower() in ("", "none", "server", "null"):
        return TimedArm(default_name, None)
    fields = parse_rf_arm(text)
    name = ",".join(f"{k}={v}" for k, v in fields.items()) or default_name
    return TimedArm(name, fields)


def server_seconds(result: StreamResult) -> float | None:
    """The server's own prompt time from the last chunk, if it reports one."""
    last = result.last or {}
    rf = last.get("rf_timings") or {}
    if isinstance(rf.get("prompt_seconds"), (int, float)):
        return float(rf["prompt_seconds"])
    timings = last.get("timings") or {}  # llama.cpp server
    if isinstance(timings.get("prompt_ms"), (int, float)):
        return float(timings["prompt_ms"]) / 1000.0
    usage = result.usage or {}
    if isinstance(usage.get("prompt_time_ms"), (int, float)):
        return float(usage["prompt_time_ms"]) / 1000.0
    return None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if len(present) == len(values) and present else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _r(arm: dict[str, Any] | None, n: int) -> float | None:
    """Layer-pass share r of an arm reported as {fill, split, tail, layers}; 1 without filled rows."""
    if not arm:
        return None
    if arm.get("fill") == "exact":
        return 1.0
    if not all(isinstance(arm.get(k), int) for k in ("layers", "split", "tail")):
        return None  # a budget's tail is set per prompt (`tail: null`): no ceiling from the arm alone
    if arm["tail"] >= n:
        return 1.0
    return ceiling_r(arm["layers"], arm["split"], arm["tail"], n)


@dataclass(frozen=True)
class TtftSettings:
    """The options of one measurement (`rf-eval ttft`'s): the protocol's counts, what each request sends, and
    which times the `speed` rows use."""

    repeats: int
    warmup: int
    max_tokens: int = 1
    model: str | None = None
    fallback_arm: dict[str, Any] | None = None  # arm B's {fill, layers, split, tail}, where the server reports none
    timing: str = "client"  # client | server: the times of the `speed` rows (both are in `lengths`)
    arm_field: str = "rf_arm"  # the body field the arms are sent in


def request_body(arm: TimedArm, ids: list[int], max_tokens: int, model: str | None, arm_field: str) -> dict[str, Any]:
    """The body of one timed request: `ids`, greedy and seeded, under `arm` (its fields in `arm_field`; None: none)."""
    body: dict[str, Any] = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
    if model:
        body["model"] = model
    if arm.fields is not None:
        body[arm_field] = arm.fields
    return body


def measure(server: Server, arms: tuple[TimedArm, TimedArm], prompts: dict[int, list[int]], settings: TtftSettings,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the protocol on `prompts` ({length: token ids}); returns the results object (JSON-ready)."""
    rows, speed = [], []
    for length, ids in prompts.items():
        timed = _timed(server, arms, length, ids, settings, progress)
        row = _length_row(length, ids, arms, timed, settings.fallback_arm)
        rows.append(row)
        timing = settings.timing
        ref_s, arm_s = (row["a"][f"median_{timing}_seconds"], row["b"][f"median_{timing}_seconds"])
        speedup = row[f"speedup_{timing}"]
        speed.append({"arm": arms[1].name, "reference": arms[0].name, "length": length, "n": settings.repeats,
                      "arm_seconds": arm_s, "ref_seconds": ref_s, "speedup": speedup, "ceiling": row["ceiling"],
                      "share": _ratio(speedup, row["ceiling"]), "timing": timing})
    return {"kind": "rf-eval-ttft", "version": 1, "base_url": server.base_url, "repeats": settings.repeats,
            "warmup": settings.warmup, "max_tokens": settings.max_tokens, "timing": settings.timing,
            "order": "per length: warm-up of each arm, then A, B alternating",
            "arms": {"a": arms[0].name, "b": arms[1].name}, "lengths": rows, "speed": speed}


def _timed(server: Server, arms: tuple[TimedArm, TimedArm], length: int, ids: list[int], settings: TtftSettings,
           progress: Callable[[str], None] | None) -> dict[str, list[StreamResult]]:
    """One length's requests: `warmup` untimed ones of each arm, then `repeats` timed ones alternating A, B."""

    def request(arm: TimedArm) -> StreamResult:
        return server.stream_completion(request_body(arm, ids, settings.max_tokens, settings.model,
                                                     settings.arm_field))

    for arm in arms:
        for _ in range(settings.warmup):
            request(arm)
    timed: dict[str, list[StreamResult]] = {"a": [], "b": []}
    for i in range(settings.repeats):
        for side, arm in zip("ab", arms):
            timed[side].append(request(arm))
            if progress:
                progress(f"N={length} {arm.name} #{i + 1}: {timed[side][-1].ttft_seconds * 1000:.1f} ms")
    return timed


def _length_row(length: int, ids: list[int], arms: tuple[TimedArm, TimedArm], timed: dict[str, list[StreamResult]],
                fallback_arm: dict[str, Any] | None) -> dict[str, Any]:
    """One length's results: each arm's times and medians, the speedups and the ceiling."""
    row: dict[str, Any] = {"length": length, "prompt_tokens": len(ids)}
    for side, arm in zip("ab", arms):
        client = [r.ttft_seconds for r in timed[side]]
        srv = [server_seconds(r) for r in timed[side]]
        reported = (timed[side][-1].last or {}).get("rf_arm") or (fallback_arm if side == "b" else None)
        row[side] = {"name": arm.name, "rf_arm": arm.fields, "server_arm": reported,
                     "client_seconds": client, "server_seconds": srv,
                     "median_client_seconds": _median(client), "median_server_seconds": _median(srv)}
    row["speedup_client"] = _ratio(row["a"]["median_client_seconds"], row["b"]["median_client_seconds"])
    row["speedup_server"] = _ratio(row["a"]["median_server_seconds"], row["b"]["median_server_seconds"])
    n = len(ids)
    b_arm = row["b"]["server_arm"] or {}
    a_arm = row["a"]["server_arm"] or {"fill": "exact"}
    r_a, r_b = _r(a_arm, n), _r(b_arm, n)
    row.update(L=b_arm.get("layers"), S=b_arm.get("split"), T=b_arm.get("tail"), N=n, ceiling=_ratio(r_a, r_b))
    return row


def format_table(result: dict[str, Any]) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1000 * x:.1f}"

    def times(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}x"

    lines = [f"A = {result['arms']['a']}   B = {result['arms']['b']}   ({result['repeats']} timed requests per arm "
             f"and length, {result['warmup']} warm-up)",
             f"{'N':>7} {'A ttft ms':>10} {'B ttft ms':>10} {'A/B':>8} {'A srv ms':>9} {'B srv ms':>9} {'A/B srv':>8} "
             f"{'ceiling':>8}"]
    for r in result["lengths"]:
        lines.append(
            f"{r['length']:>7} {ms(r['a']['median_client_seconds']):>10} {ms(r['b']['median_client_seconds']):>10} "
            f"{times(r['speedup_client']):>8} {ms(r['a']['median_server_seconds']):>9} "
            f"{ms(r['b']['median_server_seconds']):>9} {times(r['speedup_server']):>8} {times(r['ceiling']):>8}")
    return "\n".join(lines)

