"""Study reports rendered by Jinja templates (installed as `rf_eval.reports`).

`render_html`, `render_latex`, `render_markdown` and `write_reports` (from
`rf_eval.reports.render`) turn the plain data of `rf_eval.stats.study_summary`
into a self-contained HTML page, booktabs LaTeX tables and Markdown; they are
imported lazily.
"""

from __future__ import annotations

_EXPORTS = ("render_html", "render_latex", "render_markdown", "write_reports")
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from rf_eval.reports import render

        return getattr(render, name)
    raise AttributeError(f"module 'rf_eval.reports' has no attribute {name!r}")
