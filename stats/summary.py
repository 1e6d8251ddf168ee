"""Everything a study report shows, computed once and handed over as plain data.

`study_summary` compares every arm with the reference (paper section 3.3) per
task, pooled over tasks (resampled within task, section 3.4) and per length
(RULER by task and length, appendix C), and adds speed against the ceiling
where timings were recorded (section 5.3), selections against their
count-matched controls (section 3.3) and registration status (section 9).
The result holds only dicts, lists, strings, numbers and None, unrounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from rf_eval.stats.contrasts import loss_contrast, points_contrast
from rf_eval.stats.controls import control_margin
from rf_eval.stats.ledger import LedgerEntry
from rf_eval.stats.pairing import PAIR_KEYS, pair_arms
from rf_eval.stats.registration import registration
from rf_eval.stats.runs import Runs

__all__ = ["study_summary"]


def _label(task: str, filt: str, metric: str | None = None) -> str:
    label = task if filt == "none" else f"{task} [{filt}]"
    return label if metric is None else f"{label}: {metric}"


def _length_order(values: Sequence[Any]) -> list[Any]:
    """Numeric lengths in order, then named ones (LongBench's short/medium/long) sorted."""
    nums = [v for v in values if isinstance(v, (int, float, np.number)) and float(v).is_integer()]
    rest = sorted(str(v) for v in values if not any(v is n for n in nums))
    return sorted(int(v) for v in nums) + rest


def _median(x: pd.Series) -> float | None:
    x = x.dropna()
    return float(x.median()) if len(x) else None


def _status(entries: list[LedgerEntry] | None, runs: Runs, arm: str, task: str | None) -> str | None:
    return None if entries is None else registration(entries, runs.arm(arm), task).status


def _speed_rows(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    timed = pairs.dropna(subset=["prefill_seconds_arm", "prefill_seconds_ref"])
    rows = []
    groups = [("all", timed)] if timed["length"].isna().all() else list(timed.groupby("length"))
    for length, block in groups:
        if block.empty:
            continue
        speedup = float(block["prefill_seconds_ref"].median() / block["prefill_seconds_arm"].median())
        ceiling = _median(block["speedup_ceiling_arm"])
        rows.append(
            {
                "length": length if length == "all" else _length_order([length])[0],
                "n": len(block),
                "arm_seconds": float(block["prefill_seconds_arm"].median()),
                "ref_seconds": float(block["prefill_seconds_ref"].median()),
                "speedup": speedup,
                "ceiling": ceiling,
                "share": speedup / ceiling if ceiling else None,
            }
        )
    return rows


def _control_rows(
    runs: Runs, controls: Mapping[str, Sequence[str]], opts: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = []
    points = runs.items[(runs.items["unit"] == "points") & runs.items["primary"]]
    for selected, ctrl_names in controls.items():
        merged = None
        for i, ctrl in enumerate(ctrl_names):
            p = pair_arms(points, selected, ctrl)[PAIR_KEYS + ["arm", "ref"]]
            p = p.rename(columns={"ref": f"c{i}"})
            merged = p if merged is None else merged.merge(p.drop(columns="arm"), on=PAIR_KEYS)
        if merged is None or merged.empty:
            continue
        strata = (merged["task"] + "\x1f" + merged["filter"]).to_numpy()
        ctrl_scores = merged[[f"c{i}" for i in range(len(ctrl_names))]].to_numpy().T
        boot = control_margin(merged["arm"].to_numpy(), ctrl_scores, strata=strata, **opts)
        rows.append(
            {
                "selected": selected,
                "controls": list(ctrl_names),
                "n": boot.n,
                "margin": boot.difference,
                "low": boot.low,
                "high": boot.high,
            }
        )
    return rows


def study_summary(
    runs: Runs,
    reference: str,
    *,
    margin: float = 2.0,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    ledger: Sequence[LedgerEntry] | None = None,
    controls: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Compare every arm of `runs` with `reference`; see the module docstring."""
    names = [a.name for a in runs.arms]
    if reference not in names:
        raise ValueError(f"no arm named {reference!r}; the arms are: {', '.join(names)}")
    for sel, ctrls in (controls or {}).items():
        for name in (sel, *ctrls):
            if name not in names:
                raise ValueError(f"no arm named {name!r} (in --control); the arms are: {', '.join(names)}")
    opts = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    ledger_entries = list(ledger) if ledger is not None else None
    others = [n for n in names if n != reference]
    items = runs.items
    pairs = {arm: pair_arms(items, arm, reference) for arm in others}
    notes = list(runs.notes)
    for arm, p in pairs.items():
        if p.attrs.get("unpaired"):
            notes.append(f"{arm} vs {reference}: {p.attrs['unpaired']} items without a partner left out")

    ref_items = items[items["arm"] == reference]
    task_keys = list(dict.fromkeys(zip(ref_items["task"], ref_items["filter"], ref_items["metric"])))
    tasks, losses, forest = [], [], []
    for task, filt, metric in task_keys:
        block = ref_items[(ref_items["task"] == task) & (ref_items["filter"] == filt) & (ref_items["metric"] == metric)]
        unit, hib, primary = block["unit"].iloc[0], bool(block["higher_is_better"].iloc[0]), bool(block["primary"].iloc[0])
        entry: dict[str, Any] = {
            "task": _label(task, filt, None if primary else metric),
            "primary": primary,
            "metric": metric,
            "unit": unit,
            "higher_is_better": hib,
            "reference": {"n": len(block), "score": float(block["score"].mean())},
            "rows": [],
        }
        for arm in others:
            p = pairs[arm]
            p = p[(p["task"] == task) & (p["filter"] == filt) & (p["metric"] == metric)]
            if p.empty:
                continue
            if unit == "points":
                row = points_contrast(p, margin=margin, **opts)
            else:
                row = loss_contrast(p, metric=metric, higher_is_better=hib, **opts)
            row["registration"] = _status(ledger_entries, runs, arm, task)
            entry["rows"].append({"arm": arm, **row})
            if unit == "points":
                forest.append({"group": arm, "label": entry["task"], **row})
        (tasks if unit == "points" else losses).append(entry)

    overall = []
    for arm in others:
        p = pairs[arm][(pairs[arm]["unit"] == "points") & pairs[arm]["primary"]]
        if p.empty:
            continue
        strata = (p["task"] + "\x1f" + p["filter"]).to_numpy()
        row = {"arm": arm, **points_contrast(p, strata=strata, margin=margin, **opts)}
        row["registration"] = _status(ledger_entries, runs, arm, None)
        overall.append(row)
        forest.append({"group": arm, "label": "overall", **row})

    points_items = items[(items["unit"] == "points") & items["primary"] & items["length"].notna()]
    lengths = _length_order(list(points_items["length"].unique()))
    by_length = []
    for length in lengths:
        at = points_items[points_items["length"] == length]
        scores = {arm: float(at[at["arm"] == arm]["score"].mean()) for arm in names if (at["arm"] == arm).any()}
        contrasts = []
        for arm in others:
            p = pairs[arm]
            p = p[(p["unit"] == "points") & p["primary"] & (p["length"] == length)]
            if not p.empty:
                strata = (p["task"] + "\x1f" + p["filter"]).to_numpy()
                contrasts.append({"arm": arm, **points_contrast(p, strata=strata, margin=margin, **opts)})
        by_length.append({"length": length, "n": int((at["arm"] == reference).sum()), "scores": scores, "rows": contrasts})
    task_length = []
    for (task, filt), block in points_items.groupby(["task", "filter"], sort=False):
        for length in _length_order(list(block["length"].unique())):
            cell = block[block["length"] == length]
            task_length.append(
                {
                    "task": _label(task, filt),
                    "length": length,
                    "n": int((cell["arm"] == reference).sum()),
                    "scores": {a: float(cell[cell["arm"] == a]["score"].mean()) for a in names if (cell["arm"] == a).any()},
                }
            )
    if not lengths:
        notes.append("no item recorded a length (doc max_length or a RULER length metric): no per-length tables")

    speed = [{"arm": arm, **row} for arm in others for row in _speed_rows(pairs[arm][pairs[arm]["primary"]])]
    arms = []
    for a in runs.arms:
        reg = registration(ledger_entries, a) if ledger_entries is not None and a.name != reference else None
        arms.append(
            {
                "name": a.name,
                "model": a.model,
                "model_args": a.model_args_text,
                "started": a.started.isoformat(timespec="seconds"),
                "results_files": list(a.results_files),
                "n_items": int((items["arm"] == a.name).sum()),
                "is_reference": a.name == reference,
                "registration": None if reg is None else reg.__dict__.copy(),
            }
        )
    return {
        "reference": reference,
        "margin": margin,
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
        "arms": arms,
        "tasks": tasks,
        "overall": overall,
        "losses": losses,
        "lengths": lengths,
        "by_length": by_length,
        "task_length": task_length,
        "forest": forest,
        "speed": speed,
        "controls": _control_rows(runs, controls or {}, opts),
        "has_ledger": ledger_entries is not None,
        "notes": notes,
    }
