"""Pair per-item results of an arm with its reference (paper sections 3.3, 3.4 and 9).

Every arm is compared with the reference on the same inputs. Items pair by task,
filter, metric and document (doc_id, with the same doc_hash); an item pairs only if
both arms were given the same prompt and target (the same prompt_hash and
target_hash). Anything else is
refused with a message naming the task and the document: a difference in the
prompt (another chat template, few-shot draw or truncation) would be measured
as a difference between the arms.
"""

from __future__ import annotations

import pandas as pd

from rf_eval.cost.prefill_cost import COST_FIELDS
from rf_eval.stats.runs import ITEM_FIELDS

__all__ = ["PAIR_KEYS", "PairingError", "pair_arms"]

PAIR_KEYS = ["task", "filter", "metric", "doc_id"]
#: facts of the item both arms share (the arm's value, else the reference's); `copyable` is the copyable-share
#: bin a report asks for (`rf_eval.stats.copyable`), a column only then (None where `items` lacks it)
_SHARED = ["primary", "unit", "higher_is_better", "length", "domain", "subtask", "copyable"]


class PairingError(ValueError):
    """Two arms' items cannot be paired: different documents or prompts."""


def _first_mismatch(merged: pd.DataFrame, column: str) -> pd.Series | None:
    bad = merged[merged[f"{column}_arm"] != merged[f"{column}_ref"]]
    return None if bad.empty else bad.iloc[0]


def pair_arms(items: pd.DataFrame, arm: str, ref: str) -> pd.DataFrame:
    """Aligned scores of `arm` and `ref` on the items both have.

    Returns one row per paired item: the keys, the shared item facts (metric,
    unit, length, domain, subtask, copyable: the facts bootstrap strata are made of),
    `arm` and `ref` scores, and the per-sample fields and cost columns of both arms
    (`rf_eval.stats.runs.ITEM_FIELDS`, `rf_eval.cost.prefill_cost.COST_FIELDS`, suffixed `_arm`
    and `_ref`; None where `items` lacks one). `attrs["unpaired"]` counts the items only one
    of the two arms has.
    """
    a = items[items["arm"] == arm]
    r = items[items["arm"] == ref]
    merged = a.merge(r, on=PAIR_KEYS, how="inner", suffixes=("_arm", "_ref"))
    for column, what in (("doc_hash", "documents"), ("prompt_hash", "prompts"), ("target_hash", "targets")):
        row = _first_mismatch(merged, column)
        if row is not None:
            raise PairingError(
                f"task {row['task']!r}, doc {row['doc_id']}: the {what} differ between arm {arm!r} "
                f"and reference {ref!r} ({str(row[f'{column}_arm'])[:16]} vs {str(row[f'{column}_ref'])[:16]}); "
                "items are paired only when both arms saw the same document, prompt and target"
            )
    out = merged[PAIR_KEYS].copy()
    for column in _SHARED:
        if f"{column}_arm" not in merged:
            out[column] = None
            continue
        out[column] = merged[f"{column}_arm"].where(merged[f"{column}_arm"].notna(), merged[f"{column}_ref"])
    out["arm"] = merged["score_arm"].to_numpy()
    out["ref"] = merged["score_ref"].to_numpy()
    for column in (*ITEM_FIELDS, *COST_FIELDS):
        for side in ("_arm", "_ref"):
            out[column + side] = merged[column + side].to_numpy() if column + side in merged else None
    out.attrs["unpaired"] = len(a) + len(r) - 2 * len(merged)
    return out.sort_values(PAIR_KEYS, kind="stable").reset_index(drop=True)
