"""Bootstrap strata: the one rule for what every resample keeps fixed (RidgeFill paper section 3.4).

"Resampling within each task or domain keeps the mix of tasks the same in
every resample." rf-eval's items carry four facts that name a stratum, and a
comparison resamples within each combination of those that split its items:

- the lm-eval task (with its filter): tasks pooled in one row;
- the RULER task a sample comes from (the doc's `ruler_task`): the pooled
  `ruler_filled` task holds several RULER tasks as one lm-eval task;
- the document's domain (the doc's `domain`): the long documents of
  `keytoken_nll`, LongBench v2's domains;
- the length (the doc's `max_length`, or a RULER length metric): where the
  items span several lengths (the paper runs the same number of samples per
  task and length, section 3.2);
- the copyable-share bin of a `keytoken_nll` document, where the report asks
  for it (`--strata copyable`, `rf_eval.stats.copyable`; section 4.7, Table 13):
  the column `copyable`, absent otherwise.

A fact with one value over the items (one task, one length) splits nothing
and is left out of the statement; an item without a value (no domain) is a
value of its own. `strata_of` is the only place this rule lives: the summary
hands each comparison's `labels` to the bootstrap and prints its `text`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["RULE", "STRATA_FACTS", "Strata", "strata_of"]

#: (item column, the name a report prints), in the order a statement names them.
STRATA_FACTS = (("task", "task"), ("subtask", "RULER task"), ("domain", "domain"), ("length", "length"),
                ("copyable", "copyable share"))
#: The rule in words, for a report's preamble.
RULE = ("resampled within strata: each combination of task, RULER task, domain and length "
        "(and copyable-share bin, with --strata copyable) that splits a comparison's items, as each row's "
        "strata column names it")
_SEP = "\x1f"


@dataclass(frozen=True)
class Strata:
    """The strata of one comparison: a label per item (None: one stratum) and what defines them."""

    labels: np.ndarray | None
    by: tuple[str, ...]
    count: int

    @property
    def text(self) -> str:
        """What a report prints, e.g. "RULER task × length (8 strata)"; "none" for one stratum."""
        if not self.by:
            return "none"
        return f"{' × '.join(self.by)} ({self.count} strata)"


def _fact(frame: pd.DataFrame, column: str) -> pd.Series | None:
    if column == "task":
        return frame["task"].astype(str) + "[" + frame["filter"].astype(str) + "]"
    if column not in frame.columns:
        return None
    return frame[column].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))


def strata_of(frame: pd.DataFrame) -> Strata:
    """The strata of the items in `frame` (columns task, filter and, where known, subtask, domain, length)."""
    parts, by = [], []
    for column, name in STRATA_FACTS:
        values = _fact(frame, column)
        if values is not None and values.nunique() > 1:
            parts.append(values)
            by.append(name)
    if not parts:
        return Strata(None, (), 1)
    labels = parts[0]
    for part in parts[1:]:
        labels = labels + _SEP + part
    return Strata(labels.to_numpy(dtype=object), tuple(by), int(labels.nunique()))
