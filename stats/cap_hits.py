"""Length-cap hits per arm on the generation tasks (RidgeFill paper sections 4.5 and 4.6).

"RidgeFill's cwe answers also hit the length cap more often, 12 against 8 at 16K" (section 4.5); "the first
pass hit its 1,024-token cap on 301 items for stock and 302 for RidgeFill" (section 4.6). rf-eval's
generation tasks (RULER `*_filled`, `ruler_filled`, `ruler_second_question`, `longbench_v2_cot`) record per
sample whether its answer hit `max_gen_toks` (`cap_hits`, 0 or 1; the rule is `rf_eval.tasks.common.cap_hit`).

`cap_hit_rows` counts them per arm on the items the arm pairs with the reference (the fixed sample set:
a `*_filled` task's filled samples), per task, RULER task and length (and over all lengths, `all`, where a
task spans several), with the reference's count on the same items beside it; and, as section 4.5 counts
them, over every item of the task (`ALL_ITEMS`: filled or not, lm-eval's own sum of the samples' flags in
each run's results, `results_totals`) where both runs scored the same number of items. Counts, not a test:
the paper reports them so, as a note on a score's difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from rf_eval.stats.measures import task_label

__all__ = ["ALL_ITEMS", "cap_hit_rows", "cap_hit_table", "results_totals"]

#: the row of a task's every item (section 4.5's count), beside the paired rows
ALL_ITEMS = "every item"

_SAMPLE = ["task", "filter", "doc_id"]


def _length(value: Any) -> int | str | None:
    """A length as a token count, a name (LongBench's short/medium/long), or None."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, (int, float, np.number)) and float(value).is_integer():
        return int(value)
    return str(value)


def _order(value: int | str | None) -> tuple[int, Any]:
    """Numeric lengths in order, then named ones, then none."""
    return (0, value) if isinstance(value, int) else (1, value) if isinstance(value, str) else (2, "")


def _label(task: str, filt: str, subtask: Any) -> str:
    """The task, and the RULER task of a pooled `ruler_filled` sample."""
    return task_label(task, filt, subtask if isinstance(subtask, str) else None)


def results_totals(data: Mapping[str, Any], task: str) -> tuple[int, int] | None:
    """(items, cap hits) of `task` over every item a run scored: lm-eval's sum of the samples' `cap_hits` in the
    results file `data` and its effective sample count (None where the task records no cap hits)."""
    hits = ((data.get("results") or {}).get(task) or {}).get("cap_hits,none")
    items = ((data.get("n-samples") or {}).get(task) or {}).get("effective")
    return None if hits is None or items is None else (int(items), int(round(float(hits))))


def cap_hit_table(pairs: Mapping[str, pd.DataFrame], reference: str,
                  totals: Mapping[str, Mapping[str, tuple[int, int]]] | None = None) -> dict[str, Any]:
    """{"description": what a report says of the table, "rows": `cap_hit_rows` then the every-item rows}.
    `totals`: each arm's `results_totals` per task."""
    rows = cap_hit_rows(pairs) + _every_item_rows(pairs, reference, totals or {})
    return {"rows": rows, "description": (
        "Answers that hit the length cap: max_gen_toks tokens with no stop sequence or EOS met, found by "
        "re-tokenizing each answer with the run's tokenizer (rf_eval.tasks.common.cap_hit; paper sections 4.5, "
        f"4.6). Each arm's count is on the samples it pairs with {reference}, beside {reference}'s count on the "
        f"same samples, and on every item of the task (\"{ALL_ITEMS}\", filled or not, as section 4.5 counts); "
        "counts, with no test.")}


def _every_item_rows(pairs: Mapping[str, pd.DataFrame], reference: str,
                     totals: Mapping[str, Mapping[str, tuple[int, int]]]) -> list[dict[str, Any]]:
    """Per task and arm, the cap hits over every item, where the arm and the reference scored as many."""
    rows = []
    for arm in pairs:
        for task, (items, hits) in (totals.get(arm) or {}).items():
            ref = (totals.get(reference) or {}).get(task)
            if ref is not None and ref[0] == items:
                rows.append({"task": task, "length": ALL_ITEMS, "arm": arm, "n": items, "arm_hits": hits,
                             "ref_hits": ref[1]})
    return rows


def cap_hit_rows(pairs: Mapping[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """Per (task, RULER task, length) and arm: `n` paired samples with a cap flag in both arms, `arm_hits` and
    `ref_hits` (the reference's on the same samples), then the sums over lengths (`length` "all") where there
    are several; `pairs` maps each arm to its `pair_arms` frame."""
    rows = []
    for arm, p in pairs.items():
        if "cap_hits_arm" not in p or "cap_hits_ref" not in p:
            continue
        p = p[p["cap_hits_arm"].notna() & p["cap_hits_ref"].notna()].drop_duplicates(_SAMPLE)
        groups = p.assign(length=p["length"].astype(object)).groupby(
            ["task", "filter", "subtask", "length"], sort=False, dropna=False)
        for (task, filt, subtask, length), cell in groups:
            rows.append({
                "task": _label(str(task), str(filt), subtask), "length": _length(length),
                "arm": arm, "n": len(cell), "arm_hits": int(cell["cap_hits_arm"].sum()),
                "ref_hits": int(cell["cap_hits_ref"].sum()),
            })  # fmt: skip
    totals: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        totals.setdefault((r["task"], r["arm"]), []).append(r)
    for (task, arm), cells in totals.items():
        if len(cells) > 1:
            sums = {k: sum(r[k] for r in cells) for k in ("n", "arm_hits", "ref_hits")}
            rows.append({"task": task, "length": "all", "arm": arm, **sums})
    arms = list(pairs)
    return sorted(rows, key=lambda r: (r["task"], (3, "") if r["length"] == "all" else _order(r["length"]),
                                       arms.index(r["arm"])))
