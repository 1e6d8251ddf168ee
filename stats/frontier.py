"""Quality against cost: each arm's prefill cost beside its paired quality, the Pareto frontier, and the
methods that share a budget compared with each other (DESIGN 3c; RidgeFill paper sections 6.2, 6.4, 8).

Cost comes from the per-item records every rf-eval run writes (`rf_eval.cost.prefill_cost`): an arm's MAC
fraction over a set of prompts is the sum of its prefill MACs over the sum of exact's on the same prompts
(each prompt once, whatever number of metrics it has), the MAC speedup its inverse; the measured speedup is
the ratio of median prefill seconds, reference over arm, on the prompts both timed (`rf_eval.stats.speed`'s
rule), reported without an interval as timings are.

Quality is each task's primary measure (a RULER task's filled-region accuracy, `keytoken_nll`'s key-token
ΔNLL, else the task's first metric), the paired difference arm - reference with its interval, by the same
bootstrap and strata as every other table. One point per arm and length (items without a length form one
group, "all"); a point is on the frontier when no point of the same measure and length is at least as fast
and at least as good, and better in one. Arms that record the same `budget` are compared with each other
pairwise on every measure (points: the non-inferiority rule against the study's margin; losses: the
paired difference), on the reference's items only (its fixed set: a needle inside the reference's exact
tail is no test of either arm, however short their tails), pooled over lengths and at each length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from rf_eval.stats.measures import task_measures
from rf_eval.stats.pairing import PAIR_KEYS, pair_arms
from rf_eval.stats.speed import timed_pairs

__all__ = ["ALL_LENGTHS", "PrimaryMeasure", "arm_budget", "cost_of", "frontier", "matched_budgets", "primary_measures"]

#: the group of items that carry no length
ALL_LENGTHS = "all"
#: a matched-budget contrast over every length at once
POOLED = "pooled"


@dataclass(frozen=True)
class PrimaryMeasure:
    """One primary measure a frontier chart plots: a task's metric, its unit and direction."""

    task: str
    filter: str
    metric: str
    label: str
    unit: str
    higher_is_better: bool

    def items(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame["task"] == self.task) & (frame["filter"] == self.filter) & (frame["metric"] == self.metric)]

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.label, "label": self.label, "unit": self.unit, "higher_is_better": self.higher_is_better}


def primary_measures(reference_items: pd.DataFrame) -> list[PrimaryMeasure]:
    """Each task's headline measure among the reference's items: its first delta measure for a task with a
    measures table (keytoken_nll: key-token ΔNLL), else its primary metric."""
    out = []
    for (task, filt), block in reference_items.groupby(["task", "filter"], sort=False):
        spec = task_measures(task)
        if spec is not None:
            metric = next((m.metric for m in spec.measures if m.kind == "delta" and m.metric in set(block["metric"])),
                          None)
            label = next((m.label for m in spec.measures if m.metric == metric), metric)
        else:
            primary = block[block["primary"].astype(bool)]
            metric = str(primary["metric"].iloc[0]) if not primary.empty else None
            label = metric
        if metric is None:
            continue
        rows = block[block["metric"] == metric]
        name = task if filt == "none" else f"{task} [{filt}]"
        out.append(PrimaryMeasure(task, filt, metric, f"{name}: {label}", str(rows["unit"].iloc[0]),
                           bool(rows["higher_is_better"].iloc[0])))
    return out


def _group(value: Any) -> Any:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ALL_LENGTHS
    return int(value) if isinstance(value, (int, float, np.number)) and float(value).is_integer() else str(value)


def _group_order(lengths: pd.Series) -> list[Any]:
    """The length groups of some items: numeric lengths in order, then named ones, then `all`."""
    groups = {_group(v) for v in lengths}
    named = sorted(g for g in groups if isinstance(g, str) and g != ALL_LENGTHS)
    return sorted(g for g in groups if isinstance(g, int)) + named + ([ALL_LENGTHS] if ALL_LENGTHS in groups else [])


def _prompts(frame: pd.DataFrame, keys: tuple[str, ...] = ("task", "doc_id")) -> pd.DataFrame:
    """One row per prompt (its cost is the same on every metric row of it)."""
    return frame.drop_duplicates(list(keys))


def cost_of(frame: pd.DataFrame, suffix: str = "") -> dict[str, Any]:
    """MAC fraction and speedup, cache fraction, attention density (a sparse prefill's) and prompt count of the
    prompts in `frame` (item rows, or paired rows with `suffix` `_arm`); None for what no prompt recorded."""
    prompts = _prompts(frame)
    macs, exact = prompts[f"prefill_macs{suffix}"], prompts[f"exact_macs{suffix}"]
    known = macs.notna() & exact.notna()
    fraction = float(macs[known].sum() / exact[known].sum()) if known.any() else None
    cache = prompts[f"cache_fraction{suffix}"].dropna()
    density = prompts[f"attention_density{suffix}"].dropna() if f"attention_density{suffix}" in prompts else ()
    return {"n_prompts": int(known.sum()), "macs_fraction": fraction,
            "mac_speedup": 1 / fraction if fraction else None,
            "cache_fraction": float(cache.mean()) if len(cache) else None,
            "attention_density": float(density.mean()) if len(density) else None}


def measured_speedup(pairs: pd.DataFrame) -> float | None:
    """Median reference seconds over median arm seconds, on the prompts timed (`rf_eval.stats.speed.timed_pairs`:
    paired in time where the arm timed exact beside it)."""
    timed, ref_column, _ = timed_pairs(_prompts(pairs))
    if timed.empty:
        return None
    arm = float(timed["prefill_seconds_arm"].median())
    return float(timed[ref_column].median()) / arm if arm > 0 else None


def arm_budget(items: pd.DataFrame, arm: str) -> float | None:
    """The budget an arm's items record (None: not set by one)."""
    values = items.loc[items["arm"] == arm, "budget"].dropna().unique()
    return float(values[0]) if len(values) == 1 else None


Contrast = Callable[[pd.DataFrame, PrimaryMeasure], dict[str, Any]]


def frontier(items: pd.DataFrame, pairs: dict[str, pd.DataFrame], reference: str, names: list[str],
             contrast: Contrast) -> dict[str, Any]:
    """Per arm and length: cost and the paired difference on each primary measure, frontier points marked.

    `pairs[arm]` holds the arm's items paired with the reference's; `contrast(pairs, measure)` is the
    report's paired contrast of one measure (the summary's bootstrap options).
    """
    measures = primary_measures(items[items["arm"] == reference])
    arms = []
    for arm in names:
        own = items[items["arm"] == arm]
        lengths = []
        for length in _group_order(own["length"]):
            at = own[own["length"].map(_group) == length]
            entry: dict[str, Any] = {"length": length, **cost_of(at), "measured_speedup": None, "measures": {}}
            if arm == reference:
                entry["measures"] = {m.label: {"difference": 0.0, "low": 0.0, "high": 0.0, "n": len(m.items(at)),
                                               "pareto": False} for m in measures if not m.items(at).empty}
            else:
                p = pairs[arm][pairs[arm]["length"].map(_group) == length]
                entry["measured_speedup"] = measured_speedup(p)
                for m in measures:
                    mp = m.items(p)
                    if not mp.empty:
                        c = contrast(mp, m)
                        entry["measures"][m.label] = {**{k: c[k] for k in ("difference", "low", "high", "n")},
                                                      "pareto": False}
            if entry["measures"]:
                lengths.append(entry)
        arms.append({"arm": arm, "budget": arm_budget(items, arm), "is_reference": arm == reference,
                     "lengths": lengths})
    _mark_pareto(arms, measures)
    attention = any(e["attention_density"] is not None for a in arms for e in a["lengths"])
    return {"measures": [m.as_dict() for m in measures], "arms": arms, "attention": attention}


def _mark_pareto(arms: list[dict[str, Any]], measures: list[PrimaryMeasure]) -> None:
    """Set `pareto` on each point: no other point of its measure and length is at least as fast and at least as
    good, and strictly better in one. No tolerance on either axis: with one (say, speedups within 0.5% counted
    as one cost) dominance is not transitive, and a slower point could knock a faster, equally good one off
    (issue #55, item 3); a point a knob step faster but worse stays on, as the trade it is."""
    for m in measures:
        sign = 1.0 if m.higher_is_better else -1.0
        groups: dict[Any, list[dict[str, Any]]] = {}
        for a in arms:
            for entry in a["lengths"]:
                point = entry["measures"].get(m.label)
                if point is not None and entry["mac_speedup"] is not None:
                    point["x"], point["y"] = entry["mac_speedup"], sign * point["difference"]
                    groups.setdefault(entry["length"], []).append(point)
        for points in groups.values():
            for p in points:
                p["pareto"] = not any(_dominates(q, p) for q in points)
            for p in points:
                del p["x"], p["y"]


#: realised MAC fractions of one budget's arms further apart than this (2 points of exact's MACs) are flagged:
#: a coarse knob (POP's split, Speculative Prefill's chunks) can land a whole step under the budget while the
#: other arm sits at it, and the pair then compares two costs (issue #55, item 3)
UNMATCHED = 0.02


def on_reference_items(pairs: pd.DataFrame, reference_items: pd.DataFrame) -> pd.DataFrame:
    """The paired items (of two arms) that the reference scored: the fixed set both arms are compared on."""
    return pairs.merge(reference_items[PAIR_KEYS].drop_duplicates(), on=PAIR_KEYS, how="inner")


def by_length(pairs: pd.DataFrame) -> list[tuple[Any, pd.DataFrame]]:
    """(`POOLED`, every item) then (length, its items) for each length, where the items carry two or more."""
    lengths = list(pairs["length"].dropna().unique()) if "length" in pairs else []
    if len(lengths) < 2:
        return [(POOLED, pairs)]
    return [(POOLED, pairs), *((int(n), pairs[pairs["length"] == n]) for n in sorted(lengths))]


def matched_budgets(items: pd.DataFrame, names: list[str], reference: str, contrast: Contrast) -> list[dict[str, Any]]:
    """For each budget two or more arms record: each arm's realised cost and every pair's paired contrast on
    each primary measure (first arm minus second, in report order), on the reference's items, pooled and per
    length."""
    reference_items = items[items["arm"] == reference]
    measures = primary_measures(reference_items)
    by_budget: dict[float, list[str]] = {}
    for arm in names:
        budget = arm_budget(items, arm)
        if budget is not None and arm != reference:
            by_budget.setdefault(budget, []).append(arm)
    out = []
    for budget, arms in sorted(by_budget.items()):
        if len(arms) < 2:
            continue
        rows = []
        for a, b in combinations(arms, 2):
            pairs = pair_arms(items, a, b)
            for m in measures:
                mp = on_reference_items(m.items(pairs), m.items(reference_items))
                for length, block in by_length(mp) if not mp.empty else []:
                    rows.append({"arm": a, "versus": b, "measure": m.label, "unit": m.unit, "length": length,
                                 "higher_is_better": m.higher_is_better, **contrast(block, m)})
        costs = [{"arm": a, **cost_of(items[items["arm"] == a])} for a in arms]
        spent = [c["macs_fraction"] for c in costs if c.get("macs_fraction") is not None]
        spread = max(spent) - min(spent) if spent else 0.0
        out.append({"budget": budget, "arms": costs, "contrasts": rows, "spread": spread,
                    "unmatched": spread > UNMATCHED})
    return out


def _dominates(q: dict[str, Any], p: dict[str, Any]) -> bool:
    """q is at least as fast as p and at least as good, and better in one of the two (a strict partial order:
    transitive)."""
    return q["x"] >= p["x"] and q["y"] >= p["y"] and (q["x"] > p["x"] or q["y"] > p["y"])
