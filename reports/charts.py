"""Geometry of the report's inline SVG charts, as plain data for the templates.

Four charts: a forest plot of paired contrasts with their intervals (a zero
line and the non-inferiority margin drawn), accuracy by length per arm,
speedup against the ceiling per length, and quality against cost per primary
measure with its Pareto frontier. Each function returns a dict of
shapes in pixel coordinates; the template only writes them out as SVG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PALETTE", "accuracy_by_length", "forest_plot", "frontier_chart", "speed_chart"]

#: Colour-blind-safe series colours (Okabe-Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")

_ROW = 22
_LABEL_W = 260
_PLOT_W = 420
_TOP, _BOTTOM = 28, 46


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        lo, hi = lo - 1.0, lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _dodge(points: list[dict[str, Any]], x: str, y: str, *, near: float = 6.0, step: float = 7.0) -> None:
    """Shift points drawn on top of one another (centres within `near` px) apart along x by `step` px each,
    in order, so that every arm's mark shows; each shifted point's title says so."""
    placed: list[dict[str, Any]] = []
    for p in points:
        k = sum(1 for q in placed if abs(q[x] - p[x]) < near and abs(q[y] - p[y]) < near)
        placed.append(dict(p))
        if k:
            p[x] += step * k
            if "title" in p:
                p["title"] += f" (drawn {step * k:g} px right of its place: another arm's point lies there)"


def _scale(lo: float, hi: float, x0: float, width: float):
    span = hi - lo or 1.0
    return lambda v: x0 + (v - lo) / span * width


def forest_plot(
    rows: Sequence[Mapping[str, Any]], *, margin: float | None, colours: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Rows need `group`, `label`, `difference`, `low`, `high`, `passed`; x is in points, or in the rows' own
    unit where `margin` is None (a loss: no non-inferiority margin drawn).

    `colours` maps a group (arm) to its colour, so an arm keeps one colour across charts.
    """
    lows = [r["low"] for r in rows] + [0.0] + ([-margin] if margin is not None else [])
    highs = [r["high"] for r in rows] + [0.0]
    pad = 0.05 * ((max(highs) - min(lows)) or 1.0)
    lo, hi = min(lows) - pad, max(highs) + pad
    # the label column as wide as its longest "arm: task" (about 6.5 px a character), never narrower than 260
    label_w = max(_LABEL_W, 12 + int(6.5 * max((len(f"{r['group']}: {r['label']}") for r in rows), default=0)))
    x = _scale(lo, hi, label_w, _PLOT_W)
    shapes, y = [], _TOP
    groups = list(dict.fromkeys(r["group"] for r in rows))
    for gi, group in enumerate(groups):
        colour = (colours or {}).get(group) or PALETTE[gi % len(PALETTE)]
        for r in (r for r in rows if r["group"] == group):
            y += _ROW
            shapes.append(
                {
                    "label": f"{group}: {r['label']}",
                    "y": y,
                    "x_low": x(r["low"]),
                    "x_high": x(r["high"]),
                    "x_point": x(r["difference"]),
                    "colour": colour,
                    "passed": bool(r.get("passed")),
                    "title": f"{group} {r['label']}: {r['difference']:+.3g} [{r['low']:+.3g}, {r['high']:+.3g}]",
                }
            )
    height = y + _BOTTOM
    ticks = [{"x": x(t), "label": f"{t:g}"} for t in _nice_ticks(lo, hi)]
    return {
        "width": label_w + _PLOT_W + 20,
        "height": height,
        "rows": shapes,
        "ticks": ticks,
        "axis_y": height - _BOTTOM + 8,
        "top": _TOP,
        "zero_x": x(0.0),
        "label_x": label_w + _PLOT_W / 2,
        "margin_x": x(-margin) if margin is not None else None,
        "margin": margin,
    }


def _legend_width(arms: Sequence[str] | Mapping[str, Any]) -> int:
    """Room for the legend's longest arm name (about 6.5 px a character at the charts' 11 px font)."""
    return 40 + int(6.5 * max((len(str(a)) for a in arms), default=0))


def accuracy_by_length(
    lengths: Sequence[Any], series: Mapping[str, Mapping[Any, float]], *, colours: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Lines of accuracy (points, 0-100) per arm over the lengths, evenly spaced."""
    left, top, width, height = 56, 20, 520, 220
    step = width / max(1, len(lengths) - 1)
    xs = {length: left + (i * step if len(lengths) > 1 else width / 2) for i, length in enumerate(lengths)}
    y = lambda v: top + (100.0 - v) / 100.0 * height  # noqa: E731
    every = {arm: [{"x": xs[k], "y": y(v), "title": f"{arm} at {k}: {v:.1f}"} for k, v in points.items() if k in xs]
             for arm, points in series.items()}
    _dodge([p for pts in every.values() for p in pts], "x", "y")  # an arm's line on another's: drawn beside
    lines = []
    for i, (arm, pts) in enumerate(every.items()):
        if pts:
            lines.append(
                {
                    "arm": arm,
                    "colour": (colours or {}).get(arm) or PALETTE[i % len(PALETTE)],
                    "points": pts,
                    "path": " ".join(f"{p['x']:.1f},{p['y']:.1f}" for p in pts),
                }
            )
    return {
        "width": left + width + 40 + _legend_width(series),
        "height": max(top + height + 56, top + 14 * len(lines) + 20),  # the whole legend inside
        "plot": {"left": left, "top": top, "right": left + width, "bottom": top + height},
        "x_label": "prompt length (tokens)", "y_label": "accuracy (points, 0-100)",
        "x_ticks": [{"x": xs[k], "label": str(k)} for k in lengths],
        "y_ticks": [{"y": y(v), "label": str(v)} for v in (0, 25, 50, 75, 100)],
        "lines": lines,
        "legend": [{"arm": ln["arm"], "colour": ln["colour"], "y": top + 14 * i} for i, ln in enumerate(lines)],
    }


def speed_chart(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Bars of measured speedup with the ceiling marked, one per (arm, length)."""
    left, top, bar, gap, width = 200, 16, 16, 8, 420
    top_value = max([r["speedup"] for r in rows] + [r["ceiling"] or 0 for r in rows] + [1.0]) * 1.1
    x = _scale(0.0, top_value, left, width)
    bars = []
    for i, r in enumerate(rows):
        y = top + i * (bar + gap)
        bars.append(
            {
                "label": f"{r['arm']} @ {r['length']}",
                "y": y,
                "height": bar,
                "x0": left,
                "x1": x(r["speedup"]),
                "ceiling_x": x(r["ceiling"]) if r["ceiling"] else None,
                "title": f"{r['speedup']:.2f}x" + (f" of {r['ceiling']:.2f}x ceiling" if r["ceiling"] else ""),
            }
        )
    bottom = top + len(rows) * (bar + gap)
    return {
        "width": left + width + 40,
        "height": bottom + 70,
        "bars": bars,
        "x_label": "speedup over exact prefill (times)", "label_x": left + width / 2,
        "legend": [{"kind": "bar", "label": "measured speedup (wall clock)", "colour": "#0072B2"},
                   {"kind": "ceiling", "label": "MAC-model ceiling", "colour": "#D55E00"}],
        "one_x": x(1.0),
        "bottom": bottom,
        "ticks": [{"x": x(t), "label": f"{t:g}x"} for t in _nice_ticks(0.0, top_value)],
    }


def frontier_chart(measure: Mapping[str, Any], arms: Sequence[Mapping[str, Any]], *,
                   colours: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Quality against cost for one primary measure: a point per arm and length at (MAC speedup over exact,
    paired difference) with its interval as a vertical bar, the Pareto frontier of each length as a line
    through its points in order of speedup. None when no point has a cost."""
    label = measure["label"]
    points = [(a["arm"], entry, entry["measures"][label]) for a in arms for entry in a["lengths"]
              if label in entry["measures"] and entry.get("mac_speedup") is not None]
    if not points:
        return None
    left, top, width, height = 64, 24, 520, 260
    xs = [e["mac_speedup"] for _, e, _ in points] + [1.0]
    lows = [p["low"] for _, _, p in points] + [0.0]
    highs = [p["high"] for _, _, p in points] + [0.0]
    xpad = 0.05 * ((max(xs) - min(xs)) or 1.0)
    ypad = 0.08 * ((max(highs) - min(lows)) or 1.0)
    x = _scale(min(xs) - xpad, max(xs) + xpad, left, width)
    y_lo, y_hi = min(lows) - ypad, max(highs) + ypad
    y = lambda v: top + (y_hi - v) / (y_hi - y_lo) * height  # noqa: E731
    order = list(dict.fromkeys(arm for arm, _, _ in points))
    shapes, fronts = [], {}
    for arm, entry, p in points:
        colour = (colours or {}).get(arm) or PALETTE[order.index(arm) % len(PALETTE)]
        shapes.append({
            "arm": arm, "length": entry["length"], "cx": x(entry["mac_speedup"]), "cy": y(p["difference"]),
            "y_low": y(p["low"]), "y_high": y(p["high"]), "colour": colour, "pareto": bool(p.get("pareto")),
            "title": f"{arm} at {entry['length']}: {entry['mac_speedup']:.2f}x MAC speedup, "
                     f"{p['difference']:+.3g} [{p['low']:+.3g}, {p['high']:+.3g}]",
        })  # fmt: skip
        if p.get("pareto"):
            fronts.setdefault(entry["length"], []).append((entry["mac_speedup"], p["difference"]))
    _dodge(shapes, "cx", "cy")
    lines = [{"length": length, "path": " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in sorted(pts))}
             for length, pts in fronts.items() if len(pts) > 1]
    return {
        "label": label, "higher_is_better": bool(measure["higher_is_better"]), "unit": measure.get("unit"),
        "width": left + width + _legend_width(order), "height": max(top + height + 48, top + 14 * len(order) + 20),
        "y_label": f"difference from the reference ({measure.get('unit') or 'its unit'})",
        "plot": {"left": left, "top": top, "right": left + width, "bottom": top + height},
        "x_ticks": [{"x": x(t), "label": f"{t:g}x"} for t in _nice_ticks(min(xs) - xpad, max(xs) + xpad)],
        "y_ticks": [{"y": y(t), "label": f"{t:g}"} for t in _nice_ticks(y_lo, y_hi)],
        "zero_y": y(0.0), "one_x": x(1.0), "points": shapes, "frontiers": lines,
        "legend": [{"arm": arm, "colour": (colours or {}).get(arm) or PALETTE[i % len(PALETTE)], "y": top + 14 * i}
                   for i, arm in enumerate(order)],
    }
