"""Render a study summary (from `rf_eval.stats.summary`) to HTML, LaTeX and Markdown.

The templates in `templates/` only lay out what they are given: the numbers
come unrounded from `rf_eval.stats`, chart geometry from `charts`, and the
filters below do the rounding, so every difference is computed before it is
rounded (paper section 3.4).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jinja2

from rf_eval.files.outputs import check_outputs, stamp, stamp_json, write_output
from rf_eval.reports.charts import PALETTE, accuracy_by_length, forest_plot, frontier_chart, speed_chart

__all__ = ["build_view", "render_html", "render_latex", "render_markdown", "write_reports"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
_TEX_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "×": r"$\times$", "Δ": r"$\Delta$", "‖": r"$\|$", "–": "--",
}  # fmt: skip


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: Any, digits: int = 1) -> str:
    """A number with fixed decimals; a dash when missing."""
    return "–" if _missing(x) else f"{x:.{digits}f}"


def signed(x: Any, digits: int = 2) -> str:
    """A difference with its sign always shown."""
    return "–" if _missing(x) else f"{x:+.{digits}f}"


def sig(x: Any, digits: int = 4) -> str:
    """A raw measure to `digits` significant digits, sign shown."""
    return "–" if _missing(x) else f"{x:+.{digits}g}"


def pvalue(p: Any) -> str:
    if _missing(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def percent(x: Any, digits: int = 2) -> str:
    return "–" if _missing(x) else f"{100 * x:+.{digits}f}%"


def plain(x: Any, digits: int = 3) -> str:
    """A non-negative measure (KL) to `digits` significant digits, no sign."""
    return "–" if _missing(x) else f"{x:.{digits}g}"


def measure_cells(filters: dict[str, Any], missing: str) -> Any:
    """The `measure_cell` filter over a format's number filters: one cell of a measures table as text.

    delta: mean [interval] (ΔNLL, nats, 3 decimals), with the median where the
    tail is heavy (paper section 3); gap: percent [interval]; own: mean
    [interval], median (KL, reported with its median, section 4.7). "(n=...)"
    where the measure covers fewer documents than the row (key tokens).
    """

    def cell(c: dict[str, Any] | None, kind: str, n: int | None = None) -> str:
        if c is None:
            return missing
        if kind == "gap":
            num = lambda x: filters["percent"](x, 2)  # noqa: E731
        elif kind == "own":
            num = lambda x: filters["plain"](x, 3)  # noqa: E731
        else:
            num = lambda x: filters["signed"](x, 3)  # noqa: E731
        text = f"{num(c['difference'])} [{num(c['low'])}, {num(c['high'])}]"
        if kind == "own":
            text += f", median {num(c['median'])}"
        elif kind == "delta" and c.get("heavy_tail"):
            text += f", median {num(c['median'])} (heavy tail)"
        if n is not None and c["n"] != n:
            text += f" (n={c['n']})"
        return text

    return cell


def engine_floor(arm: dict[str, Any]) -> str:
    """An arm's engine floor (paper sections 4.3, 9) in words; a dash where the run recorded none.

    The partial path with every row exact against the stock model (bitwise, or
    max |Δ| and KL of the last row), then the filled-row attention kernel's.
    """
    floor = arm.get("engine_floor")
    if not isinstance(floor, dict):
        return "–"

    def one(f: dict[str, Any]) -> str:
        return "bitwise" if f.get("bitwise") else f"max |Δ| {f.get('max_abs', float('nan')):.2g}, KL {f.get('kl', float('nan')):.2g}"

    text = f"partial path {one(floor)}"
    if isinstance(floor.get("filled_kernel"), dict):
        text += f"; filled-row kernel {one(floor['filled_kernel'])}"
    return text


def times(x: Any, digits: int = 2) -> str:
    """A speedup: `1.33×`; a dash when missing."""
    return "–" if _missing(x) else f"{x:.{digits}f}×"


def in_unit(x: Any, unit: str | None) -> str:
    """A paired difference in its measure's unit: points to 2 decimals, a raw measure to 3 significant digits."""
    return signed(x) if unit == "points" else sig(x, 3)


def length_name(length: Any) -> str:
    """A length as a table prints it: 1,024, or a group's name (`all`: items without a length)."""
    return f"{length:,}" if isinstance(length, int) else str(length)


def cost_text(arm: dict[str, Any]) -> str:
    """An arm's cost in one cell: its budget, then per length the MAC speedup over exact (and the measured
    one where timings exist); a dash where the runs recorded no cost."""
    parts = []
    for c in arm.get("cost") or []:
        if c.get("mac_speedup") is None:
            continue
        text = f"{length_name(c['length'])}: {times(c['mac_speedup'])}"
        if c.get("measured_speedup") is not None:
            text += f" (measured {times(c['measured_speedup'])})"
        parts.append(text)
    budget = f"budget {arm['budget']:g}; " if arm.get("budget") is not None else ""
    return budget + "; ".join(parts) if parts else "–"


def mac_speedups(arm: dict[str, Any]) -> str:
    """An arm's MAC speedups over exact by length, in the report's order (deterministic: no timings)."""
    return "; ".join(f"{length_name(c['length'])}: {times(c['mac_speedup'])}" for c in arm.get("cost") or []
                     if c.get("mac_speedup") is not None) or "–"


def tex(value: Any) -> str:
    """Escape text for LaTeX."""
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(value))


def md(value: Any) -> str:
    """Escape text for a Markdown table cell."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _environment(latex: bool) -> jinja2.Environment:
    options: dict[str, Any] = {
        "loader": jinja2.FileSystemLoader(str(TEMPLATES)),
        "undefined": jinja2.StrictUndefined,
        "trim_blocks": True,
        "lstrip_blocks": True,
        "keep_trailing_newline": True,
    }
    if latex:  # LaTeX is full of braces: use delimiters that never occur in it
        options.update(
            block_start_string="<%", block_end_string="%>", variable_start_string="<<",
            variable_end_string=">>", comment_start_string="<#", comment_end_string="#>",
        )  # fmt: skip
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(["html.j2"]), **options)
    filters = {"fmt": fmt, "signed": signed, "sig": sig, "pvalue": pvalue, "percent": percent, "plain": plain,
               "times": times, "in_unit": in_unit}
    if latex:  # numbers in math mode, "--" where missing, % and × escaped
        filters = {name: _latex_number(f, math=name not in ("percent", "times")) for name, f in filters.items()}
    cell = measure_cells(filters, "--" if latex else "–")
    env.filters.update(filters, tex=tex, md=md, engine_floor=engine_floor, measure_cell=cell, cost_text=cost_text,
                       length_name=length_name, mac_speedups=mac_speedups)
    return env


def _latex_number(format_: Any, math: bool) -> Any:
    def wrapped(x: Any, *args: Any) -> str:
        text = format_(x, *args)
        if text == "–":
            return "--"
        return f"${text}$" if math else tex(text)

    return wrapped


def build_view(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary plus the geometry of its charts."""
    series = {
        arm["name"]: {row["length"]: row["scores"][arm["name"]] for row in summary["by_length"] if arm["name"] in row["scores"]}
        for arm in summary["arms"]
    }
    colours = {arm["name"]: PALETTE[i % len(PALETTE)] for i, arm in enumerate(summary["arms"])}
    front = summary.get("frontier") or {"measures": [], "arms": []}
    return {
        "budgets": [], "frontier": front, "score_set": "",
        "ledger_head": None, "metrics": {"points": "none", "tasks": "none", "losses": "none"}, "standalone": False,
        "measures": [], "strata_rule": "", "cross_model": [], "notes": [], "copyable": None,
        "cap_hits": {"rows": [], "description": ""},
        **summary,
        "charts": {
            "forest": forest_plot(summary["forest"], margin=summary["margin"], colours=colours)
            if summary["forest"]
            else None,
            "loss_forest": forest_plot(summary["loss_forest"], margin=None, colours=colours)
            if summary.get("loss_forest") else None,
            "length": accuracy_by_length(summary["lengths"], series, colours=colours) if summary["lengths"] else None,
            "speed": speed_chart(summary["speed"]) if summary["speed"] else None,
            "frontier": [chart for m in front["measures"]
                         if (chart := frontier_chart(m, front["arms"], colours=colours)) is not None],
        },
        "arm_names": [a["name"] for a in summary["arms"]],
        "has_floor": any(isinstance(a.get("engine_floor"), dict) for a in summary["arms"]),
    }


def _render(template: str, summary: dict[str, Any], latex: bool = False, **extra: Any) -> str:
    return _environment(latex).get_template(template).render(**{**build_view(summary), **extra})


def render_html(summary: dict[str, Any]) -> str:
    """A self-contained HTML page: inline CSS and SVG, no scripts, nothing fetched."""
    return _render("report.html.j2", summary)


def render_latex(summary: dict[str, Any], *, standalone: bool = False) -> str:
    """Booktabs tables as a fragment a paper can `\\input` (with `standalone`, a whole document)."""
    return _render("report.tex.j2", summary, latex=True, standalone=standalone)


def render_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables for a README."""
    return _render("report.md.j2", summary)


def render_demo_table(summary: dict[str, Any]) -> str:
    """The demo's one table (`rf-eval demo`, the README's first screen): per arm its filled-region needles
    and their paired difference, and keytoken_nll's key-token and novel-token ΔNLL and KL, from the report."""
    return _render("demo_table.md.j2", summary)


def _json_value(x: Any) -> Any:
    """numpy scalars and arrays as plain JSON values."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def write_reports(
    summary: dict[str, Any],
    *,
    html: str | Path | None = None,
    latex: str | Path | None = None,
    markdown: str | Path | None = None,
    json_path: str | Path | None = None,
    latex_standalone: bool = False,
    overwrite: bool = False,
) -> list[Path]:
    """Write each requested format; return the paths written (LaTeX: a fragment unless `latex_standalone`;
    JSON: the summary itself, every figure the tables show, before rounding). Every output is checked
    (`rf_eval.files.outputs.check_outputs`: no folder, no file rf-eval did not write unless `overwrite`) and
    rendered before the first is written, so a refusal or a failed rendering leaves every file as it was;
    each carries rf-eval's output mark."""

    paths = check_outputs({"--html": html, "--latex": latex, "--markdown": markdown, "--json": json_path},
                          overwrite=overwrite)
    texts = {
        "--html": lambda: stamp(render_html(summary), "html"),
        "--latex": lambda: stamp(render_latex(summary, standalone=latex_standalone), "tex"),
        "--markdown": lambda: stamp(render_markdown(summary), "md"),
        "--json": lambda: json.dumps(stamp_json(summary), indent=1, default=_json_value) + "\n",
    }
    rendered = {option: texts[option]() for option in paths}
    return [write_output(paths[option], text) for option, text in rendered.items()]
