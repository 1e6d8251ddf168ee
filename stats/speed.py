"""Speed against the ceiling, where per-item timings were recorded (paper sections 2.5, 3.4, 5.3).

The speedup is the ratio of median times, reference over arm, on the same items
(per length where items carry one), with its sample size and a 95% percentile
interval from resampling the paired items (the paper reports timings without
one; a few CPU wall-clock timings on a shared machine need it); the ceiling is the
MAC model's speedup as the arm recorded it (`mac_speedup` per item,
`rf_eval.cost.prefill_cost`), and `share` is how much of it was reached.

Which times are paired (`timed_pairs`, the one rule): where the arm's run timed the exact prefill of each
prompt beside its own (`exact_prefill_seconds`, the `reference=exact` pass, interleaved), those, *paired in
time*; else the reference run's own timings of the same prompts, measured in another process at another
time (*separate runs*), which on a shared machine rank arms by when they ran. A measured speedup above the
MAC ceiling, its whole interval above it (not noise), is flagged (`above_ceiling`): a correct cost model
does not allow it on compute-bound work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

RESAMPLES, CONFIDENCE = 2000, 0.95

__all__ = ["PAIRED_IN_TIME", "SEPARATE_RUNS", "speed_rows", "timed_pairs"]

PAIRED_IN_TIME, SEPARATE_RUNS = "paired in time", "separate runs"


def timed_pairs(pairs: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    """(the paired items with both times, the column of the reference's seconds, which timing): the exact
    prefill timed beside the arm's where the arm recorded it, else the reference run's (module docstring)."""
    beside = (pairs.dropna(subset=["prefill_seconds_arm", "exact_prefill_seconds_arm"])
              if "exact_prefill_seconds_arm" in pairs else pairs.iloc[:0])
    if not beside.empty:
        return beside, "exact_prefill_seconds_arm", PAIRED_IN_TIME
    return pairs.dropna(subset=["prefill_seconds_arm", "prefill_seconds_ref"]), "prefill_seconds_ref", SEPARATE_RUNS


def _median(x: pd.Series) -> float | None:
    x = x.dropna()
    return float(x.median()) if len(x) else None


def _interval(ref: np.ndarray, arm: np.ndarray) -> tuple[float, float]:
    """The percentile interval of the ratio of medians over the paired items resampled (seeded: reproducible)."""
    pick = np.random.default_rng(0).integers(0, len(ref), size=(RESAMPLES, len(ref)))
    ratios = np.median(ref[pick], axis=1) / np.median(arm[pick], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def speed_rows(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of (length, n, median seconds of both arms, speedup, its interval, ceiling, share, timing,
    above_ceiling) from paired items."""
    timed, ref_column, timing = timed_pairs(pairs)
    if timed.empty:
        return []
    groups = [("all", timed)] if timed["length"].isna().all() else list(timed.groupby("length", sort=False))
    rows = []
    for length, block in groups:
        arm_s, ref_s = float(block["prefill_seconds_arm"].median()), float(block[ref_column].median())
        ceiling = _median(block["mac_speedup_arm"])
        speedup = ref_s / arm_s
        low, high = _interval(block[ref_column].to_numpy(float), block["prefill_seconds_arm"].to_numpy(float))
        rows.append(
            {
                "length": length,
                "n": len(block),
                "arm_seconds": arm_s,
                "ref_seconds": ref_s,
                "speedup": speedup,
                "low": low,
                "high": high,
                "ceiling": ceiling,
                "share": speedup / ceiling if ceiling else None,
                "timing": timing,
                "above_ceiling": bool(ceiling and low > ceiling),
            }
        )
    return rows
