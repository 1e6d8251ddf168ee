"""Everything a study report shows, computed once and handed over as plain data.

`study_summary` compares every arm with the reference (paper section 3.3) per
task, pooled over tasks and per length (RULER by task and length, appendix
C), reads `keytoken_nll` by the measures of section 3.1 (`measures`: key- and
novel-token ΔNLL, the novel-token perplexity gap, KL; all-token ΔNLL beside
them), and adds speed against the ceiling where timings were recorded
(section 5.3), each arm's prefill cost and the quality-cost frontier, with
the arms that share a budget compared with each other (`frontier`; sections
6.2, 6.4, 8), selections against their count-matched controls (section 3.3),
registration status (section 9), each arm's length-cap hits on the generation
tasks beside the reference's (`cap_hits`, sections 4.5, 4.6) and, with
`SummaryOptions(strata=("copyable",))`, keytoken_nll's measures per copyable-share bin
(`copyable`, section 4.7, Table 13; `rf_eval.stats.copyable`). Every interval
resamples within the strata of `rf_eval.stats.strata` (section 3.4), named in
each row's `strata`.
The result holds only dicts, lists, strings, numbers and None, unrounded.
This module checks what is asked and puts the summary together; each table is computed by
`rf_eval.stats.tables.StudyTables`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rf_eval.stats.cap_hits import cap_hit_table
from rf_eval.stats.comparable import check_comparable
from rf_eval.stats.contrasts import is_loss_metric
from rf_eval.stats.copyable import COLUMN as COPYABLE
from rf_eval.stats.copyable import DEFAULT_EDGES, STRATA, check_edges, copyable_tables, with_copyable_bins
from rf_eval.stats.ledger import LedgerEntry
from rf_eval.stats.runs import Runs
from rf_eval.stats.strata import RULE
from rf_eval.stats.tables import StudyTables

__all__ = ["SummaryOptions", "study_summary"]


@dataclass(frozen=True)
class SummaryOptions:
    """How `study_summary` compares the arms: each field is the `rf-eval report` option of the same name
    (`n_resamples`: `--resamples`; `controls`: `--control` as {SELECTED: [CONTROL, ...]})."""

    margin: float = 2.0
    confidence: float = 0.95
    n_resamples: int = 10_000
    seed: int = 0
    controls: Mapping[str, Sequence[str]] | None = None
    cross_model: bool = False
    strata: Sequence[str] = ()
    copyable_bins: Sequence[float] = DEFAULT_EDGES


def _check_request(runs: Runs, reference: str, options: SummaryOptions) -> None:
    """The reference and every arm `--control` names are arms of `runs`, there are two arms at least, and
    every stratum is one a report adds."""
    names = [a.name for a in runs.arms]
    controls = options.controls or {}
    if len(names) < 2:  # said first: with one arm, the reference is most likely the arm not given
        raise ValueError(f"a report compares arms, and the runs given hold one arm ({', '.join(names)}); "
                         "give the lm-eval output folders of at least two arms")
    for name, where in [(reference, "")] + [(n, " (in --control)") for s, c in controls.items() for n in (s, *c)]:
        if name not in names:
            raise ValueError(f"no arm named {name!r}{where}; the arms are: {', '.join(names)}")
    unknown = [s for s in options.strata if s not in STRATA]
    if unknown:
        raise ValueError(f"--strata {', '.join(unknown)}: unknown; the strata a report adds: {', '.join(STRATA)}")


def _check_paired(runs: Runs, reference: str, tables: list[dict[str, Any]]) -> None:
    """Some arm has an item paired with the reference's in one of `tables` (else the arms ran other tasks)."""
    if not any(entry["rows"] for entry in tables):
        ran = "; ".join(f"{a}: {', '.join(sorted(set(runs.items.loc[runs.items['arm'] == a, 'task'])))}"
                        for a in (arm.name for arm in runs.arms))
        raise ValueError(f"no item of any arm pairs with an item of the reference {reference!r}: the arms ran "
                         f"different tasks or documents ({ran})")


def loss_forest(losses: list[dict[str, Any]], measures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Forest rows of each task's primary measure that is a per-token loss (nats): a measures table's first
    column (its primary measure, e.g. keytoken_nll's key-token ΔNLL) and each primary loss table in nats."""
    rows = []
    for table in measures:
        first = table["columns"][0]
        if not is_loss_metric(first["metric"], False):
            continue
        for row in table["rows"]:
            cell = row["cells"].get(first["key"])
            if cell is not None:
                rows.append({"group": row["arm"], "label": f"{table['task']}: {first['label']}", "passed": None,
                             **{k: cell[k] for k in ("difference", "low", "high")}})
    for entry in (e for e in losses if e["primary"] and e["unit"] == "nats"):
        rows += [{"group": r["arm"], "label": entry["task"], "passed": None,
                  **{k: r[k] for k in ("difference", "low", "high")}} for r in entry["rows"]]
    return rows


def study_summary(
    runs: Runs,
    reference: str,
    options: SummaryOptions | None = None,
    *,
    ledger: Sequence[LedgerEntry] | None = None,
) -> dict[str, Any]:
    """Compare every arm of `runs` with `reference`; see the module docstring.

    Arms on other weights or another task protocol than the reference are
    refused (`rf_eval.stats.comparable`) unless `options.cross_model`, which labels them.
    `options.strata` adds facts to the bootstrap strata and a table per value: `copyable`, keytoken_nll's
    copyable-share bins cut at `options.copyable_bins` (`rf_eval.stats.copyable`).
    """
    o = options or SummaryOptions()
    _check_request(runs, reference, o)
    edges = check_edges(o.copyable_bins)
    if COPYABLE in o.strata:
        runs = replace(runs, items=with_copyable_bins(runs.items, reference, edges))
    labels = check_comparable(runs, reference, cross_model=o.cross_model)
    opts = {"confidence": o.confidence, "n_resamples": o.n_resamples, "seed": o.seed}
    study = StudyTables(runs, reference, o.margin, opts, None if ledger is None else list(ledger))
    tasks, losses, forest = study.tasks()
    measures = study.measures()
    _check_paired(runs, reference, tasks + losses + measures)
    overall = study.overall()
    lengths = study.by_length()
    front = study.frontier()
    notes = labels + study.notes()
    if not lengths["lengths"]:
        notes.append("no item recorded a length (doc max_length or a RULER length metric): no per-length tables")
    return {
        "reference": reference, "margin": o.margin, "confidence": o.confidence, "n_resamples": o.n_resamples,
        "seed": o.seed,
        "score_set": f"every arm's score on {reference}'s items (the fixed sample set; an arm's own others are not "
                     "scored)",
        "arms": study.arms(front), "tasks": tasks, "overall": overall, "measures": measures, "losses": losses,
        **lengths, "frontier": front, "budgets": study.budgets(),
        "forest": forest + [{"group": r["arm"], "label": "overall", **r} for r in overall],
        "loss_forest": loss_forest(losses, measures),
        "speed": study.speed(), "controls": study.controls(o.controls or {}),
        "has_ledger": ledger is not None, "ledger_head": None, "notes": notes, "cross_model": labels, "strata_rule": RULE,
        "metrics": _metrics_used(tasks, losses),
        "cap_hits": cap_hit_table(study.pairs, reference, {a.name: a.cap_hits for a in study.runs.arms}),
        "copyable": copyable_tables(study.runs.items, study.pairs, reference, edges, study.measure_row)
        if COPYABLE in o.strata else None,
    }  # fmt: skip


def _metrics_used(tasks: list[dict[str, Any]], losses: list[dict[str, Any]]) -> dict[str, str]:
    """The metric behind each table, as its caption prints it ("task: metric; ...")."""
    def text(entries: list[dict[str, Any]], primary_only: bool) -> str:
        return "; ".join(f"{e['task'].split(': ')[0]}: {e['metric']}" for e in entries
                         if e["rows"] and (e["primary"] or not primary_only)) or "none"

    return {"points": text(tasks, True), "tasks": text(tasks, False), "losses": text(losses, False)}
