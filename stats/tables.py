"""The tables of a study summary, each computed from every arm's items paired with the reference's.

`StudyTables` pairs every arm with the reference once and computes each table
`rf_eval.stats.summary.study_summary` hands over: per task (accuracy and loss),
pooled, per length, the measures tables (`rf_eval.stats.measures`), speed,
selections against their count-matched controls, the arms, and the notes. An
arm's own measures (KL) are never paired; every arm's score is on the
reference's items (`StudyTables.fixed_set_scores`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rf_eval.stats.contrasts import loss_contrast, own_measure, points_contrast
from rf_eval.stats.controls import control_margin
from rf_eval.stats.frontier import cost_of, frontier, matched_budgets, measured_speedup
from rf_eval.stats.ledger import LedgerEntry
from rf_eval.stats.measures import MEASURES, task_label, task_measures
from rf_eval.stats.pairing import PAIR_KEYS, pair_arms
from rf_eval.stats.registration import registration
from rf_eval.stats.runs import Runs
from rf_eval.stats.speed import speed_rows
from rf_eval.stats.strata import STRATA_FACTS, strata_of

__all__ = ["StudyTables"]


def _length_value(value: Any) -> int | str:
    """A length as an int (token count) or a name (LongBench's short/medium/long)."""
    if isinstance(value, (int, float, np.number)) and float(value).is_integer():
        return int(value)
    return str(value)


def _length_order(values: Sequence[Any]) -> list[int | str]:
    """Numeric lengths in order, then named ones sorted."""
    lengths = {_length_value(v) for v in values}
    return sorted(v for v in lengths if isinstance(v, int)) + sorted(v for v in lengths if isinstance(v, str))


def _pooled(frame: pd.DataFrame) -> pd.DataFrame:
    """The items that pool: accuracy-like (points), each task's primary metric."""
    return frame[(frame["unit"] == "points") & frame["primary"].astype(bool)]


@dataclass
class StudyTables:
    """Each table of a study summary, from every arm's items paired with the reference's (`pairs`)."""

    runs: Runs
    reference: str
    margin: float
    opts: dict[str, Any]
    ledger: list[LedgerEntry] | None

    def __post_init__(self) -> None:
        self.names = [a.name for a in self.runs.arms]
        self.others = [n for n in self.names if n != self.reference]
        items = self.runs.items
        own = [(task_measures(t) is not None and m in task_measures(t).own_metrics)
               for t, m in zip(items["task"], items["metric"])]
        paired = items[~np.asarray(own, dtype=bool)] if len(items) else items  # own measures are never paired
        self.pairs = {arm: pair_arms(paired, arm, self.reference) for arm in self.others}
        self.set_notes: list[str] = []  # arms scored on fewer of the reference's items (`fixed_set_scores`)

    def status(self, arm: str, task: str | None) -> str | None:
        return None if self.ledger is None else registration(self.ledger, self.runs.arm(arm), task).status

    def points(self, p: pd.DataFrame) -> dict[str, Any]:
        return points_contrast(p, margin=self.margin, **self.opts)

    def loss(self, p: pd.DataFrame, metric: str, hib: bool) -> dict[str, Any]:
        return loss_contrast(p, metric=metric, higher_is_better=hib, **self.opts)

    def tasks(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """Per (task, filter, metric): accuracy tables, loss tables, and forest rows."""
        ref = self.runs.items[self.runs.items["arm"] == self.reference]
        tasks, losses, forest = [], [], []
        for (task, filt, metric), block in ref.groupby(["task", "filter", "metric"], sort=False):
            spec = task_measures(task)
            if spec is not None and metric in spec.metrics:
                continue  # reported in its task's measures table (`measures`)
            first = block.iloc[0]
            unit, hib, primary = first["unit"], bool(first["higher_is_better"]), bool(first["primary"])
            entry: dict[str, Any] = {
                "task": task_label(task, filt, None if primary else metric),
                "primary": primary, "metric": metric, "unit": unit, "higher_is_better": hib,
                "reference": {"n": len(block), "score": float(block["score"].mean())},
                "rows": [],
            }  # fmt: skip
            for arm in self.others:
                p = self.pairs[arm]
                p = p[(p["task"] == task) & (p["filter"] == filt) & (p["metric"] == metric)]
                if p.empty:
                    continue
                if unit == "points":
                    row = self.points(p)
                    forest.append({"group": arm, "label": entry["task"], **row})
                else:
                    row = self.loss(p, metric, hib)
                entry["rows"].append({"arm": arm, **row, "registration": self.status(arm, task)})
            (tasks if unit == "points" else losses).append(entry)
        return tasks, losses, forest

    def overall(self) -> list[dict[str, Any]]:
        """Each arm pooled over the accuracy tasks, resampled within task, beside its cost on those items."""
        rows = []
        for arm in self.others:
            p = _pooled(self.pairs[arm])
            if not p.empty:
                row = self.points(p)
                cost = cost_of(p, "_arm")
                rows.append({"arm": arm, **row, "registration": self.status(arm, None),
                             "mac_speedup": cost["mac_speedup"], "measured_speedup": measured_speedup(p)})
        return rows

    def contrast(self, pairs: pd.DataFrame, measure: Any) -> dict[str, Any]:
        """The report's paired contrast of one primary measure (`rf_eval.stats.frontier`)."""
        if measure.unit == "points":
            return self.points(pairs)
        return self.loss(pairs, measure.metric, measure.higher_is_better)

    def frontier(self) -> dict[str, Any]:
        paired = self.runs.items
        return frontier(paired, self.pairs, self.reference, self.names, self.contrast)

    def budgets(self) -> list[dict[str, Any]]:
        return matched_budgets(self.runs.items, self.names, self.reference, self.contrast)

    def by_length(self) -> dict[str, Any]:
        """Accuracy per length per arm (tasks pooled, and per task), and contrasts per length. Every arm's score
        is on the reference's items (`fixed_set_scores`)."""
        items = _pooled(self.runs.items)
        items = items[items["length"].notna()]
        lengths = _length_order(list(items["length"].unique()))
        pooled = {arm: _pooled(self.pairs[arm]) for arm in self.others}
        rows = []
        for length in lengths:
            at = items[items["length"] == length]
            contrasts = []
            for arm in self.others:
                p = pooled[arm][pooled[arm]["length"] == length]
                if not p.empty:
                    contrasts.append({"arm": arm, **self.points(p)})
            n = int((at["arm"] == self.reference).sum())
            scores = self.fixed_set_scores(at, {a: p[p["length"] == length] for a, p in pooled.items()}, length)
            rows.append({"length": length, "n": n, "scores": scores, "rows": contrasts})
        per_task = []
        for (task, filt), block in items.groupby(["task", "filter"], sort=False):
            for length in _length_order(list(block["length"].unique())):
                cell = block[block["length"] == length]
                n = int((cell["arm"] == self.reference).sum())
                paired = {a: p[(p["task"] == task) & (p["filter"] == filt) & (p["length"] == length)]
                          for a, p in pooled.items()}
                per_task.append({"task": task_label(task, filt), "length": length, "n": n,
                                 "scores": self.fixed_set_scores(cell, paired, f"{task_label(task, filt)} at {length}")})
        return {"lengths": lengths, "by_length": rows, "task_length": per_task}

    def fixed_set_scores(self, items: pd.DataFrame, paired: dict[str, pd.DataFrame], where: Any) -> dict[str, float]:
        """Each arm's mean on the reference's items of `items`: "the set of samples is fixed per model and shared
        by every arm" (RidgeFill paper section 3.1). The reference's own mean; every other arm's on the items it
        pairs with the reference (`paired`), so an arm whose own rule scores more items (POP's one-row tail keeps
        needles in the reference's tail filled) is scored on the reference's alone. An arm that scored fewer of
        them is noted."""
        reference = items[items["arm"] == self.reference]
        scores = {self.reference: float(reference["score"].mean())} if len(reference) else {}
        for arm, p in paired.items():
            if p.empty:
                continue
            scores[arm] = float(p["arm"].mean())
            if len(p) < len(reference):
                self.set_notes.append(f"{arm}: scored on {len(p)} of the reference's {len(reference)} items "
                                      f"({where}): the others it did not score")
        return {a: scores[a] for a in self.names if a in scores}

    def measures(self) -> list[dict[str, Any]]:
        """Per task with a measures table (`rf_eval.stats.measures`): one row per arm, one cell per measure."""
        items = self.runs.items
        ref = items[items["arm"] == self.reference]
        tables = []
        for task, filt in ref[["task", "filter"]].drop_duplicates().itertuples(index=False):
            spec = task_measures(task)
            if spec is None:
                continue
            rows = []
            for arm in self.others:
                p = self.pairs[arm]
                p = p[(p["task"] == task) & (p["filter"] == filt)]
                own = items[(items["arm"] == arm) & (items["task"] == task) & (items["filter"] == filt)]
                row = self.measure_row(arm, spec, p, own)
                if row is not None:
                    rows.append({**row, "registration": self.status(arm, task)})
            loaded = set(items.loc[(items["task"] == task) & (items["filter"] == filt), "metric"])
            tables.append({
                "task": task_label(task, filt), "title": spec.title, "description": spec.description,
                "columns": spec.columns, "metrics": ", ".join(m for m in spec.metrics if m in loaded) or "none",
                "rows": rows,
            })  # fmt: skip
        return tables

    def measure_row(self, arm: str, spec: Any, pairs: pd.DataFrame, own: pd.DataFrame) -> dict[str, Any] | None:
        """One arm's row of a measures table on these items (None where no measure has any)."""
        cells = self.measure_cells(spec, pairs, own)
        if all(c is None for c in cells.values()):
            return None
        widest = max((c for c in cells.values() if c is not None), key=lambda c: c["n"])
        return {"arm": arm, "n": widest["n"], "cells": cells, "strata": widest["strata"]}

    def measure_cells(self, spec: Any, pairs: pd.DataFrame, own: pd.DataFrame) -> dict[str, Any]:
        """Each measure of `spec` on one arm's items (None where its metric has no paired items)."""
        contrasts: dict[str, dict[str, Any] | None] = {}
        cells: dict[str, Any] = {}
        for m in spec.measures:
            if m.kind == "own":
                values = own[own["metric"] == m.metric]
                cells[m.key] = own_measure(values, **self.opts) if not values.empty else None
                continue
            if m.metric not in contrasts:
                p = pairs[pairs["metric"] == m.metric]
                contrasts[m.metric] = None if p.empty else self.loss(p, m.metric, False)
            c = contrasts[m.metric]
            if m.kind == "delta" or c is None:
                cells[m.key] = c
            else:  # the perplexity gap of the same paired loss
                gap = c["gap"]
                cells[m.key] = None if gap is None else {
                    "n": c["n"], "difference": gap["gap"], "low": gap["low"], "high": gap["high"], "median": None,
                    "heavy_tail": False, "per_domain": gap["per_domain"], "strata": c["strata"],
                }  # fmt: skip
        return cells

    def speed(self) -> list[dict[str, Any]]:
        rows = []
        for arm in self.others:
            p = self.pairs[arm]
            for row in speed_rows(p[p["primary"].astype(bool)]):
                rows.append({"arm": arm, **row, "length": _length_value(row["length"])})
        return rows

    def controls(self, controls: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
        """Each selection against the per-item mean of its count-matched control arms."""
        points = _pooled(self.runs.items)
        facts = [c for c, _ in STRATA_FACTS if c not in PAIR_KEYS]
        rows = []
        for selected, ctrl_names in controls.items():
            first = pair_arms(points, selected, ctrl_names[0])
            merged = first[PAIR_KEYS + facts + ["arm", "ref"]].rename(columns={"ref": "c0"})
            for i, ctrl in enumerate(ctrl_names[1:], start=1):
                p = pair_arms(points, selected, ctrl)[PAIR_KEYS + ["ref"]].rename(columns={"ref": f"c{i}"})
                merged = merged.merge(p, on=PAIR_KEYS)
            if merged.empty:
                continue
            ctrl_scores = merged[[f"c{i}" for i in range(len(ctrl_names))]].to_numpy().T
            strata = strata_of(merged)
            boot = control_margin(merged["arm"].to_numpy(), ctrl_scores, strata=strata.labels, **self.opts)
            rows.append({"selected": selected, "controls": list(ctrl_names), "n": boot.n, "margin": boot.difference,
                         "low": boot.low, "high": boot.high, "strata": strata.text})  # fmt: skip
        return rows

    def arms(self, front: dict[str, Any]) -> list[dict[str, Any]]:
        """Each arm: what ran, its items, and its cost at each length (from the frontier's points)."""
        costs = {a["arm"]: a for a in front["arms"]}
        rows = []
        for a in self.runs.arms:
            reg = None if self.ledger is None or a.name == self.reference else registration(self.ledger, a)
            points = costs.get(a.name, {}).get("lengths", [])
            rows.append({
                "name": a.name, "model": a.model, "model_args": a.model_args_text,
                "started": a.started.isoformat(timespec="seconds"), "results_files": list(a.results_files),
                "n_items": int((self.runs.items["arm"] == a.name).sum()), "is_reference": a.name == self.reference,
                "registration": None if reg is None else reg.__dict__.copy(), "engine_floor": a.engine_floor,
                "budget": costs.get(a.name, {}).get("budget"),
                "cost": [{k: p[k] for k in ("length", "macs_fraction", "mac_speedup", "measured_speedup",
                                            "cache_fraction")} for p in points],
            })  # fmt: skip
        return rows

    def notes(self) -> list[str]:
        # a measure an arm takes against its own exact pass (KL) is no omission for the reference itself
        own = {m.metric for reading in MEASURES.values() for m in (reading.measures or ()) if m.kind == "own"}
        skip = tuple(f"no per-item values of {metric}:" for metric in own)
        notes = [n for n in self.runs.notes if not (n.startswith(f"{self.reference}: ") and any(s in n for s in skip))]
        notes += list(dict.fromkeys(self.set_notes))
        for arm, p in self.pairs.items():
            if p.attrs.get("unpaired"):
                notes.append(f"{arm} vs {self.reference}: {p.attrs['unpaired']} items without a partner left out")
        return notes
