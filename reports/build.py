"""A report over lm-eval runs, end to end: what `rf-eval report`, a study and the demo all run.

`build_report` reads the arms' output folders, checks them against the ledger when one is given, computes
the paired statistics (`rf_eval.stats.summary.study_summary`) and writes them (`rf_eval.reports.render`).
Every output path is checked before anything is read or written (`rf_eval.files.outputs.check_outputs`). Its
refusals are `UserError`s naming the `rf-eval report` option at fault (`--ledger`, `--html`, ...);
`report_argv` is the command line that gives `rf-eval report` the same arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.files.outputs import check_outputs
from rf_eval.reports.render import write_reports
from rf_eval.stats.copyable import DEFAULT_EDGES
from rf_eval.stats.ledger import Head, LedgerError, check_head, ledger_head, verify_ledger
from rf_eval.stats.ledger_results import check_results, record_results
from rf_eval.stats.pairing import PairingError
from rf_eval.stats.runs import RunFormatError, load_runs
from rf_eval.stats.summary import study_summary

__all__ = ["Report", "build_report", "check_recorded_heads", "report_argv", "ttft_speed_rows"]


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
        rows.extend(data["speed"])
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


def build_report(
    runs: Sequence[str | Path],
    *,
    reference: str,
    html: str | Path,
    margin: float = 2.0,
    ledger: str | Path | None = None,
    latex: str | Path | None = None,
    latex_standalone: bool = False,
    markdown: str | Path | None = None,
    json_path: str | Path | None = None,
    overwrite: bool = False,
    allow_empty: bool = False,
    cross_model: bool = False,
    controls: Mapping[str, Sequence[str]] | None = None,
    metrics: Mapping[str, Sequence[str]] | None = None,
    strata: Sequence[str] = (),
    copyable_bins: Sequence[float] | None = None,
    ttft: Sequence[str] = (),
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Report:
    """Paired statistics of the arms in `runs` against `reference`, written as HTML (and LaTeX, Markdown,
    JSON where given). Each parameter is the `rf-eval report` option of the same name (`json_path`:
    `--json`; `metrics`, `controls`: `--metric`, `--control` as {NAME: [VALUE, ...]}; `copyable_bins`: the
    parsed `--copyable-bins`)."""
    if margin < 0 or resamples < 1 or not 0 < confidence < 1:
        raise UserError("--margin must be >= 0, --resamples >= 1 and --confidence in (0, 1)")
    ledger = str(ledger) if ledger else None
    try:
        if latex_standalone and not latex:
            raise UserError("--latex-standalone needs --latex FILE")
        if copyable_bins is not None and "copyable" not in strata:
            raise UserError("--copyable-bins needs --strata copyable")
        edges = DEFAULT_EDGES if copyable_bins is None else tuple(copyable_bins)
        check_outputs({"--html": html, "--latex": latex, "--markdown": markdown, "--json": json_path},
                      overwrite=overwrite)
        loaded = load_runs([str(r) for r in runs], metrics={k: list(v) for k, v in (metrics or {}).items()},
                           allow_empty=allow_empty)
        entries = verify_ledger(ledger) if ledger else None
        if entries is not None:
            check_recorded_heads(loaded, entries)
            check_results(ledger, entries)
        summary = study_summary(
            loaded,
            reference,
            margin=margin,
            confidence=confidence,
            n_resamples=resamples,
            seed=seed,
            ledger=entries,
            controls={k: list(v) for k, v in (controls or {}).items()},
            cross_model=cross_model,
            strata=list(dict.fromkeys(strata)),
            copyable_bins=edges,
        )
    except LedgerError as err:
        raise UserError(f"ledger {ledger}: {err}") from None
    except (RunFormatError, PairingError, ValueError) as err:
        raise UserError(str(err)) from None
    summary["speed"] = list(summary["speed"]) + ttft_speed_rows(ttft)
    report = Report(summary)
    if entries is not None:
        files = [f for arm in loaded.arms for f in (*arm.results_files, *arm.samples_files)]
        entry = record_results(ledger, entries, files, arms=[arm.name for arm in loaded.arms])
        if entry is not None:
            report.lines.append(f"ledger {ledger}: entry {entry.index} records the sha256 of {len(entry.files)} "
                                "result files")
        head = ledger_head(ledger)
        summary["ledger_head"] = {"path": str(Path(ledger).resolve()), "hash": head.hash, "count": head.count}
    report.written = list(write_reports(summary, html=html, latex=latex, markdown=markdown, json_path=json_path,
                                        latex_standalone=latex_standalone, overwrite=overwrite))
    report.lines += [f"wrote {path}" for path in report.written]
    report.lines += [f"note: {note}" for note in summary["notes"]]
    return report


def report_argv(runs: Sequence[str | Path], *, reference: str, html: str | Path, margin: float = 2.0,
                ledger: str | Path | None = None, latex: str | Path | None = None,
                markdown: str | Path | None = None, json_path: str | Path | None = None,
                controls: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """The `rf-eval report` command line (without `rf-eval`) that gives `build_report` these arguments, the
    defaults left out: what a study prints as the command it ran."""
    argv = ["report", *map(str, runs), "--reference", reference]
    if margin != 2.0:
        argv += ["--margin", str(margin)]
    for option, value in (("--ledger", ledger), ("--html", html), ("--latex", latex), ("--markdown", markdown),
                          ("--json", json_path)):
        if value is not None:
            argv += [option, str(value)]
    for selected, names in (controls or {}).items():
        argv += ["--control", f"{selected}={','.join(names)}"]
    return argv
