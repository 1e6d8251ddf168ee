"""A selection's margin over its count-matched controls (paper section 3.3).

If each exact row adds its own fixed benefit, a random set of rows gains on
average the same share of the benefit as its share of the rows. So a selection
compared with random rows of the *same count* measures only how well it chose;
a control of another size would add a term that depends on the count alone.
The margin is the paired difference, per item, between the selected arm and
the mean of its control arms (several seeds of the random control may be
given), with a paired bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from rf_eval.stats.bootstrap import PairedBootstrap, paired_bootstrap

__all__ = ["control_margin"]


def control_margin(
    selected: ArrayLike,
    controls: ArrayLike | Sequence[ArrayLike],
    *,
    selected_count: int | None = None,
    control_counts: Sequence[int] | None = None,
    strata: ArrayLike | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired margin of `selected` over the per-item mean of its count-matched `controls`.

    `controls` is one array of per-item scores, or several (one per control
    seed), aligned with `selected`. When the row counts are given, every control
    must match the selection's count, or the margin would not measure the choice.
    """
    ctrl = np.asarray(controls, dtype=np.float64)
    sel = np.asarray(selected, dtype=np.float64).reshape(-1)
    if ctrl.ndim == 1:
        ctrl = ctrl[None, :]
    if ctrl.ndim != 2 or ctrl.shape[1] != sel.shape[0]:
        raise ValueError(f"each control needs one score per item ({sel.shape[0]} items)")
    if selected_count is not None or control_counts is not None:
        counts = list(control_counts or [])
        if selected_count is None or len(counts) != ctrl.shape[0]:
            raise ValueError("give the selection's row count and one count per control")
        mismatched = [c for c in counts if c != selected_count]
        if mismatched:
            raise ValueError(
                f"controls must match the selection's count ({selected_count} rows); got {mismatched}"
            )
    return paired_bootstrap(
        sel, ctrl.mean(axis=0), strata=strata, n_resamples=n_resamples, confidence=confidence, seed=seed
    )
