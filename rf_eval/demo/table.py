"""The demo's table: rendered from its report, written beside it and, on request, into the README.

`rf-eval demo` writes `OUT/demo_table.md` from `OUT/report.json` (the report's own figures,
`rf_eval.reports.render.render_demo_table`); `rf-eval demo --readme README.md` also replaces the
README's block for that size, between the two marker comments below, and keeps the report it was
rendered from beside the README (`benchmarks/demo/<size>_report.json`), so the README's demo figures are
never typed. tests/demo/test_demo.py renders both blocks again from those records, and compares the quick
block with what the demo in CI produced.
"""

from __future__ import annotations

import json
from pathlib import Path

from rf_eval.reports.render import render_demo_table

TABLE_FILE = "demo_table.md"
RECORD_DIR = Path("benchmarks") / "demo"  # beside the README: the reports its demo tables were rendered from


def record_path(readme: Path, quick: bool) -> Path:
    """Where `--readme` keeps the report a size's table was rendered from."""
    return readme.resolve().parent / RECORD_DIR / f"{'quick' if quick else 'full'}_report.json"


def markers(quick: bool) -> tuple[str, str]:
    """The comments around the README block of one demo size."""
    command = "rf-eval demo --quick" if quick else "rf-eval demo"
    return (f"<!-- table written by `{command} --readme README.md`; do not edit -->",
            f"<!-- end of `{command}` table -->")


def render_table(report: dict, caption: str) -> str:
    """The demo's table: `caption`, then the report's figures (`render_demo_table`)."""
    return caption + "\n\n" + render_demo_table(report)


def write_table(out: Path, caption: str) -> str:
    """Render `out/report.json` as the demo's table, under `caption`, into `out/demo_table.md`; returns it."""
    table = render_table(json.loads((out / "report.json").read_text(encoding="utf-8")), caption)
    (out / TABLE_FILE).write_text(table, encoding="utf-8")
    return table


def readme_block(text: str, quick: bool) -> str | None:
    """The table between one size's markers in a README's text (None when the markers are missing)."""
    begin, end = markers(quick)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def replace_block(readme: Path, table: str, quick: bool, report: Path | None = None) -> None:
    """Put `table` between the size's markers in `readme` (an error naming them when they are missing), and
    copy `report` (the JSON it was rendered from) to `record_path`."""
    text = readme.read_text(encoding="utf-8")
    begin, end = markers(quick)
    if readme_block(text, quick) is None:
        raise ValueError(f"{readme} has no demo table block: add the lines\n{begin}\n{end}\nwhere it goes")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    readme.write_text(f"{head}{begin}\n{table.rstrip()}\n{end}{tail}", encoding="utf-8")
    if report is not None:
        record = record_path(readme, quick)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(report.read_text(encoding="utf-8"), encoding="utf-8")
