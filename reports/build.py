"""A report over lm-eval runs, end to end: what `rf-eval report`, a study and the demo all run.

`build_report` reads the arms' output folders, checks them against the ledger when one is given, computes
the paired statistics (`rf_eval.stats.summary.study_summary`) and writes them (`rf_eval.reports.render`).
Every output path is checked before anything is read or written (`rf_eval.files.outputs.check_outputs`). Its
refusals are `UserError`s naming the `rf-eval report` option at fault (`--ledger`, `--html`, ...);
its arguments are a `ReportOptions`, one field per `rf-eval report` option, and `report_argv` is the
command line that gives `rf-eval report` the same arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.files.outputs import check_outputs
from rf_eval.reports.render import write_reports
from rf_eval.stats.copyable import DEFAULT_EDGES
from rf_eval.stats.ledger import Head, LedgerError, check_head, ledger_head, verify_ledger
from rf_eval.stats.ledger_results import check_results, record_results
from rf_eval.stats.pairing import PairingError
from rf_eval.stats.runs import RunFormatError, Runs, load_runs
from rf_eval.stats.summary import SummaryOptions, study_summary

__all__ = ["Report", "ReportOptions", "build_report", "check_recorded_heads", "report_argv",
           "ttft_speed_rows"]


@dataclass
class Report:
    """What `build_report` did: the figures, the files it wrote, and what it says about them (`lines`)."""

    summary: dict[str, Any]
    written: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # ledger entry, files written, notes: what the command prints


def ttft_speed_rows(paths: Sequence[str]) -> list[dict]:
    """Speed rows of `rf-eval ttft` result files (medians and ratios, no intervals: paper section 3.4)."""
    rows = []
    for path in paths:
        try:
            data = json.loads(open(path).read())
        except OSError as err:
            raise UserError(f"--ttft {path}: cannot read it ({err.strerror or err})") from None
        except json.JSONDecodeError as err:
            raise UserError(f"--ttft {path}: not an `rf-eval ttft` result (not JSON: {err.msg} at line {err.lineno})") from None
        if data.get("kind") != "rf-eval-ttft":
            raise UserError(f"--ttft {path}: not an `rf-eval ttft` result (kind {data.get('kind')!r})")
        # served timings (`rf-eval ttft`: its rows say client or server clock), none flagged: no interval to do it by
        rows.extend({"timing": "served", "above_ceiling": False, **row} for row in data["speed"])
    return rows


def check_recorded_heads(runs: Any, ledger: list[Any]) -> None:
    """Every ledger head a run recorded must still be in the ledger (a truncated ledger fails)."""
    for arm in runs.arms:
        for head in arm.ledger_heads:
            try:
                check_head(ledger, Head(str(head["hash"]), int(head["count"]) if head.get("count") is not None else None))
            except (LedgerError, ValueError) as err:
                raise UserError(f"arm {arm.name} ({head.get('results')}) recorded ledger head "
                                f"{head['hash']}:{head.get('count')}, which the ledger no longer holds: {err}") from None


@dataclass(frozen=True)
class ReportOptions:
    """What a report is asked for: each field is the `rf-eval report` option of the same name (`runs`: its
    RUN_DIR arguments; `json_path`: `--json`; `metrics`, `controls`: `--metric`, `--control` as
    {NAME: [VALUE, ...]}; `copyable_bins`: the parsed `--copyable-bins`)."""

    runs: Sequence[str | Path]
    reference: str
    html: str | Path | None = None
    margin: float = 2.0
    ledger: str | Path | None = None
    latex: str | Path | None = None
    latex_standalone: bool = False
    markdown: str | Path | None = None
    json_path: str | Path | None = None
    overwrite: bool = False
    allow_empty: bool = False
    allow_unsealed: bool = False
    cross_model: bool = False
    controls: Mapping[str, Sequence[str]] | None = None
    metrics: Mapping[str, Sequence[str]] | None = None
    strata: Sequence[str] = ()
    copyable_bins: Sequence[float] | None = None
    ttft: Sequence[str] = ()
    resamples: int = 10_000
    confidence: float = 0.95
    seed: int = 0


#: each option's default (`report_argv` leaves those out), and the options that are flags
_DEFAULTS = {f.name: f.default for f in fields(ReportOptions)}
_FLAGS = ("latex_standalone", "allow_empty", "allow_unsealed", "cross_model", "overwrite")


def _check_options(o: ReportOptions) -> None:
    """Refuse values out of range and options given without the one they need."""
    if o.margin < 0 or o.resamples < 1 or not 0 < o.confidence < 1:
        raise UserError("--margin must be >= 0, --resamples >= 1 and --confidence in (0, 1)")
    if not any((o.html, o.latex, o.markdown, o.json_path)):
        raise UserError("no output asked for: give one or more of --html FILE, --latex FILE, --markdown FILE, "
                        "--json FILE")
    if o.latex_standalone and not o.latex:
        raise UserError("--latex-standalone needs --latex FILE")
    if o.copyable_bins is not None and "copyable" not in o.strata:
        raise UserError("--copyable-bins needs --strata copyable")


def _summary_options(o: ReportOptions) -> SummaryOptions:
    """The statistics' options of the report's (`--copyable-bins` defaulted, each stratum once)."""
    return SummaryOptions(
        margin=o.margin,
        confidence=o.confidence,
        n_resamples=o.resamples,
        seed=o.seed,
        controls={k: list(v) for k, v in (o.controls or {}).items()},
        cross_model=o.cross_model,
        strata=list(dict.fromkeys(o.strata)),
        copyable_bins=DEFAULT_EDGES if o.copyable_bins is None else tuple(o.copyable_bins),
    )


def _record_in_ledger(ledger: str, entries: list[Any], loaded: Runs, summary: dict[str, Any]) -> list[str]:
    """Record the result files read in the ledger, and its head in `summary`; the line saying so."""
    files = [f for arm in loaded.arms for f in (*arm.results_files, *arm.samples_files)]
    entry = record_results(ledger, entries, files, arms=[arm.name for arm in loaded.arms])
    head = ledger_head(ledger)
    summary["ledger_head"] = {"path": str(Path(ledger).resolve()), "hash": head.hash, "count": head.count}
    if entry is None:
        return []
    return [f"ledger {ledger}: entry {entry.index} records the sha256 of {len(entry.files)} result files"]


def build_report(options: ReportOptions) -> Report:
    """Paired statistics of the arms in `options.runs` against `options.reference`, written in each format
    asked for (HTML, LaTeX, Markdown, JSON)."""
    o = options
    _check_options(o)
    ledger = str(o.ledger) if o.ledger else None
    try:
        check_outputs({"--html": o.html, "--latex": o.latex, "--markdown": o.markdown, "--json": o.json_path},
                      overwrite=o.overwrite)
        metrics = {k: list(v) for k, v in (o.metrics or {}).items()}
        loaded = load_runs([str(r) for r in o.runs], metrics=metrics, allow_empty=o.allow_empty,
                           allow_unsealed=o.allow_unsealed)
        entries = verify_ledger(ledger) if ledger else None
        if entries is not None:
            check_recorded_heads(loaded, entries)
            check_results(ledger, entries)
        summary = study_summary(loaded, o.reference, _summary_options(o), ledger=entries)
    except LedgerError as err:
        raise UserError(f"ledger {ledger}: {err}") from None
    except (RunFormatError, PairingError, ValueError) as err:
        raise UserError(str(err)) from None
    summary["speed"] = list(summary["speed"]) + ttft_speed_rows(o.ttft)
    report = Report(summary)
    if entries is not None:
        report.lines += _record_in_ledger(ledger, entries, loaded, summary)
    report.written = list(write_reports(summary, html=o.html, latex=o.latex, markdown=o.markdown,
                                        json_path=o.json_path, latex_standalone=o.latex_standalone,
                                        overwrite=o.overwrite))
    report.lines += [f"wrote {path}" for path in report.written]
    report.lines += [f"note: {note}" for note in summary["notes"]]
    return report


def _given(o: ReportOptions, name: str) -> bool:
    """Whether option `name` differs from its default."""
    return getattr(o, name) != _DEFAULTS[name]


def report_argv(options: ReportOptions) -> list[str]:
    """The `rf-eval report` command line (without `rf-eval`) that gives `build_report` these options, the
    defaults left out: what a study prints as the command it ran."""
    o = options
    argv = ["report", *map(str, o.runs), "--reference", o.reference]
    if _given(o, "margin"):
        argv += ["--margin", str(o.margin)]
    for option, value in (("--ledger", o.ledger), ("--html", o.html), ("--latex", o.latex),
                          ("--markdown", o.markdown), ("--json", o.json_path)):
        if value is not None:
            argv += [option, str(value)]
    for selected, names in (o.controls or {}).items():
        argv += ["--control", f"{selected}={','.join(names)}"]
    argv += [f"--{name.replace('_', '-')}" for name in _FLAGS if getattr(o, name)]
    for task, names in (o.metrics or {}).items():
        argv += ["--metric", f"{task}={','.join(names)}"]
    argv += [arg for stratum in o.strata for arg in ("--strata", stratum)]
    if o.copyable_bins is not None:
        argv += ["--copyable-bins", ",".join(map(str, o.copyable_bins))]
    argv += [arg for path in o.ttft for arg in ("--ttft", str(path))]
    return argv + [arg for name in ("resamples", "confidence", "seed") if _given(o, name)
                   for arg in (f"--{name}", str(getattr(o, name)))]
