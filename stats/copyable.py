"""Copyable-share strata of `keytoken_nll` (RidgeFill paper section 4.7, Table 13: "Post-prompt KL and ΔNLL
by copyable share").

"The means are carried by a few documents. Splitting the documents by how much of the scored text is a
verbatim copy of earlier text (the token and the 8 tokens before it already occur earlier in the window ...)
shows which ones." A document's copyable share is the fraction of its scored tokens that are copyable
(`rf_eval.tasks.token_masks.copyable_mask`); `keytoken_nll` records it per document (`copyable_share`).

The paper does not give its bins. rf-eval's default cut points are 0.1 and 0.5, bins [0, 0.1), [0.1, 0.5)
and [0.5, 1]: documents whose scored text is essentially new (ordinary prose; a few repeated phrases stay
under 0.1), documents that partly repeat earlier text, and copy-heavy ones where most scored tokens could be
copied (the paper's extreme case, a code repository's tail at share 1.00, falls in the last). `--copyable-bins`
sets other cut points: increasing, each strictly between 0 and 1. Every bin is closed below and open above,
the last closed at 1: a share equal to a cut point falls in the bin above it.

A document's bin is the reference arm's share of it (the same for every arm on one tokenizer; each arm's own
where the reference did not score the document). The bin is one more fact of the bootstrap strata
(`rf_eval.stats.strata`, column `copyable`): with `--strata copyable` every keytoken_nll comparison resamples
within bins, and the report shows each bin's measures table (`rf_eval.stats.summary`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rf_eval.stats.measures import task_label, task_measures

if TYPE_CHECKING:  # pandas only where items are binned: the CLI reads the options below without it
    import pandas as pd

__all__ = ["COLUMN", "DEFAULT_EDGES", "STRATA", "bin_labels", "bin_of", "check_edges", "copyable_tables",
           "parse_edges", "with_copyable_bins"]

#: the item column holding a document's bin (a fact of `rf_eval.stats.strata`)
COLUMN = "copyable"
#: the per-sample field keytoken_nll records
SHARE = "copyable_share"
DEFAULT_EDGES: tuple[float, ...] = (0.1, 0.5)
#: the strata a report can add (`--strata`)
STRATA = ("copyable",)
_KEY = ["task", "filter", "doc_id"]
_EXAMPLE = "e.g. 0.1,0.5 for [0, 0.1), [0.1, 0.5), [0.5, 1]"


def check_edges(edges: Sequence[float]) -> tuple[float, ...]:
    """The cut points, checked: at least one, each a number strictly between 0 and 1, increasing."""
    values = tuple(float(x) for x in edges)
    if not values:
        raise ValueError(f"--copyable-bins: give one cut point or more ({_EXAMPLE})")
    for x in values:
        if not (math.isfinite(x) and 0 < x < 1):
            raise ValueError(f"--copyable-bins: {x:g} is not strictly between 0 and 1; a copyable share lies in "
                             f"[0, 1], so give cut points inside it ({_EXAMPLE})")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"--copyable-bins: {','.join(f'{x:g}' for x in values)} is not increasing; give each cut "
                         f"point once, smallest first ({_EXAMPLE})")
    return values


def parse_edges(text: str) -> tuple[float, ...]:
    """`--copyable-bins` text ("0.1,0.5") as checked cut points (`check_edges`)."""
    parts = [p.strip() for p in str(text).split(",")]
    values = []
    for part in parts:
        try:
            values.append(float(part))
        except ValueError:
            raise ValueError(f"--copyable-bins {text!r}: {part!r} is not a number; give comma-separated cut "
                             f"points ({_EXAMPLE})") from None
    return check_edges(values)


def bin_labels(edges: Sequence[float]) -> list[str]:
    """The bins as a table prints them: "[0, 0.1)", "[0.1, 0.5)", "[0.5, 1]"."""
    points = [0.0, *edges, 1.0]
    return [f"[{a:g}, {b:g}{']' if i == len(points) - 2 else ')'}" for i, (a, b) in enumerate(zip(points, points[1:]))]


def bin_of(share: Any, edges: Sequence[float]) -> str | None:
    """The bin of a copyable share (a share on a cut point goes to the bin above); None without a share."""
    if share is None or (isinstance(share, float) and not math.isfinite(share)):
        return None
    return bin_labels(edges)[bisect_right(list(edges), float(share))]


def with_copyable_bins(items: pd.DataFrame, reference: str, edges: Sequence[float]) -> pd.DataFrame:
    """`items` with the column `COLUMN`: each document's bin by the reference's share of it (else the item's
    own), None for items without a share (other tasks)."""
    import pandas as pd

    if "keytoken_nll" not in set(items["task"]):
        raise ValueError("--strata copyable: no arm ran keytoken_nll, the task that records each document's "
                         "copyable share; add its runs or leave out --strata copyable")
    if SHARE not in items or items[SHARE].notna().sum() == 0:
        raise ValueError("--strata copyable: no keytoken_nll document recorded copyable_share (a run of an older "
                         "rf-eval); rerun keytoken_nll or leave out --strata copyable")
    out = items.copy()
    has = out[SHARE].notna()
    ref = out[has & (out["arm"] == reference)].drop_duplicates(_KEY)
    by_doc = {tuple(k): s for k, s in zip(ref[_KEY].itertuples(index=False), ref[SHARE])}
    shares = [by_doc.get(tuple(k), s) for k, s in zip(out[_KEY].itertuples(index=False), out[SHARE])]
    out[COLUMN] = pd.Series([bin_of(s, edges) for s in shares], index=out.index, dtype=object)
    return out


def copyable_tables(
    items: pd.DataFrame,
    pairs: Mapping[str, pd.DataFrame],
    reference: str,
    edges: Sequence[float],
    row: Callable[[str, Any, pd.DataFrame, pd.DataFrame], dict[str, Any] | None],
) -> dict[str, Any]:
    """Each measures table again per bin (paper Table 13): per task with measures (`rf_eval.stats.measures`)
    and bin, the reference's documents in the bin and each arm's row on them (`row(arm, spec, pairs, own)`, the
    summary's measures row: the same contrasts as the whole table, on the bin's items). `items` and `pairs`
    carry the column `COLUMN` (`with_copyable_bins`)."""
    binned = items[items[COLUMN].notna() & (items["arm"] == reference)]
    tables = []
    for task, filt in binned[["task", "filter"]].drop_duplicates().itertuples(index=False):
        spec = task_measures(task)
        if spec is None:
            continue
        at = items[(items["task"] == task) & (items["filter"] == filt)]
        bins = []
        for label in bin_labels(edges):
            here = at[at[COLUMN] == label]
            rows = []
            for arm, p in pairs.items():
                r = row(arm, spec, p[(p["task"] == task) & (p["filter"] == filt) & (p[COLUMN] == label)],
                        here[here["arm"] == arm])
                rows += [r] if r is not None else []
            bins.append({"bin": label, "docs": int(here.loc[here["arm"] == reference, "doc_id"].nunique()),
                         "rows": rows})
        metrics = ", ".join(m for m in spec.metrics if m in set(at["metric"])) or "none"
        tables.append({"task": task_label(task, filt), "title": spec.title, "columns": spec.columns,
                       "metrics": metrics, "bins": bins})
    cuts = ",".join(f"{x:g}" for x in edges)
    description = (
        "Copyable share: the fraction of a document's scored tokens that are a verbatim copy of earlier text (the "
        "token and the ngram tokens before it, default 8, already occur earlier in the window the model read; "
        f"paper section 4.7, Table 13). Bins {', '.join(bin_labels(edges))} (--copyable-bins {cuts}; a share on "
        f"a cut point falls in the bin above); a document's bin is {reference}'s share of it. Each bin's rows "
        "are the paired differences on its documents.")
    return {"edges": list(edges), "bins": bin_labels(edges), "description": description, "tables": tables}
