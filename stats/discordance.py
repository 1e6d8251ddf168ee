"""Tests on discordant items: the sign test and the exact McNemar test (paper section 4.6).

Paired items on which both arms agree carry no information about which arm is
better; the tests look only at the others. For right/wrong outcomes the exact
McNemar test and the sign test are the same two-sided binomial test on the
discordant pairs (paper 4.6: 48 vs 41 discordant items give p = 0.525).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import binomtest

__all__ = ["McNemar", "SignTest", "mcnemar_exact", "sign_test"]


@dataclass(frozen=True)
class SignTest:
    """Items where the arm scored higher (`wins`), lower (`losses`) or the same (`ties`)."""

    wins: int
    losses: int
    ties: int
    p_value: float


@dataclass(frozen=True)
class McNemar:
    """2x2 table of right/wrong outcomes and the exact (binomial) McNemar p-value.

    `arm_only` = arm right and reference wrong; `ref_only` = the reverse.
    """

    both: int
    arm_only: int
    ref_only: int
    neither: int
    p_value: float


def _pair(arm: ArrayLike, ref: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(arm, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    if a.shape != r.shape:
        raise ValueError(f"paired scores must have the same length ({a.shape[0]} != {r.shape[0]})")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(r))):
        raise ValueError("scores contain NaN or infinite values")
    return a, r


def _two_sided(k: int, n: int) -> float:
    return 1.0 if n == 0 else float(binomtest(k, n, 0.5, alternative="two-sided").pvalue)


def sign_test(arm: ArrayLike, ref: ArrayLike) -> SignTest:
    """Two-sided exact sign test of paired scores; tied items are left out."""
    a, r = _pair(arm, ref)
    wins, losses = int(np.sum(a > r)), int(np.sum(a < r))
    return SignTest(wins, losses, int(a.shape[0]) - wins - losses, _two_sided(wins, wins + losses))


def mcnemar_exact(arm_correct: ArrayLike, ref_correct: ArrayLike) -> McNemar:
    """Exact McNemar test of paired right/wrong outcomes (booleans, 0/1 or 0/100)."""
    a, r = _pair(arm_correct, ref_correct)
    for name, x in (("arm", a), ("reference", r)):
        if not np.all((x == 0) | (x == x.max())):
            raise ValueError(f"McNemar needs right/wrong outcomes; the {name} scores are not binary")
    a, r = a > 0, r > 0
    arm_only, ref_only = int(np.sum(a & ~r)), int(np.sum(~a & r))
    return McNemar(
        both=int(np.sum(a & r)),
        arm_only=arm_only,
        ref_only=ref_only,
        neither=int(np.sum(~a & ~r)),
        p_value=_two_sided(arm_only, arm_only + ref_only),
    )
