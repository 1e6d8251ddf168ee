"""Non-inferiority against a margin fixed in advance, with the binomial floor (paper section 3.4).

The claim "the arm is at most `margin` points worse than the reference" passes
when a one-sided lower bound on the paired difference lies above -margin. The
bound is the more conservative of two numbers: the one-sided bootstrap bound,
and the binomial floor -100 (1 - alpha^(1/n)) points for n samples. The floor
binds when both arms get nearly every sample right: the bootstrap interval then
shrinks toward zero, but n samples cannot rule out a failure rate of up to about
3/n (at alpha = 0.05), and the floor keeps the bound from claiming more
precision than the sample size allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from numpy.typing import ArrayLike

from rf_eval.stats.bootstrap import PairedBootstrap, paired_bootstrap

__all__ = ["NonInferiority", "binomial_floor", "decide_noninferiority", "noninferiority"]


def binomial_floor(n: int, alpha: float = 0.05) -> float:
    """The binomial floor in points for `n` samples: -100 (1 - alpha^(1/n)).

    With no failure seen in n samples, failure rates up to 1 - alpha^(1/n) are
    still consistent at level alpha (paper section 3.4: -1.38 at n = 216, -1.36
    at n = 219, -2.15 at n = 138).
    """
    if n < 1:
        raise ValueError(f"the binomial floor needs at least one sample, got n={n}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    return -100.0 * (1.0 - alpha ** (1.0 / n))


@dataclass(frozen=True)
class NonInferiority:
    """Outcome of a non-inferiority test in points.

    `bound` is min(bootstrap_lower, floor); `binding` names which of the two it
    is (the floor on a tie); `passed` is bound > -margin.
    """

    difference: float
    bootstrap_lower: float
    floor: float
    bound: float
    binding: Literal["bootstrap", "floor"]
    margin: float
    passed: bool
    n: int
    alpha: float


def decide_noninferiority(
    difference: float, bootstrap_lower: float, n: int, *, margin: float, alpha: float = 0.05
) -> NonInferiority:
    """Combine a one-sided bootstrap bound (level 1 - alpha) with the floor for n samples."""
    if margin < 0:
        raise ValueError(f"the margin is a positive number of points, got {margin}")
    floor = binomial_floor(n, alpha)
    binding: Literal["bootstrap", "floor"] = "floor" if floor <= bootstrap_lower else "bootstrap"
    bound = min(floor, bootstrap_lower)
    return NonInferiority(
        difference=difference,
        bootstrap_lower=bootstrap_lower,
        floor=floor,
        bound=bound,
        binding=binding,
        margin=margin,
        passed=bool(bound > -margin),
        n=n,
        alpha=alpha,
    )


def noninferiority(
    arm: ArrayLike,
    ref: ArrayLike,
    *,
    margin: float,
    strata: ArrayLike | None = None,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
    bootstrap: PairedBootstrap | None = None,
) -> NonInferiority:
    """Test that `arm` is no more than `margin` points worse than `ref`.

    Scores are per item in points (0 or 100 for accuracy), paired by position.
    The one-sided bootstrap bound is the alpha-quantile of the stratified paired
    bootstrap; pass `bootstrap` (computed at confidence 1 - alpha) to reuse one.
    """
    if bootstrap is None:
        bootstrap = paired_bootstrap(
            arm, ref, strata=strata, n_resamples=n_resamples, confidence=1.0 - alpha, seed=seed
        )
    elif not math.isclose(bootstrap.confidence, 1.0 - alpha):
        raise ValueError(f"the bootstrap was computed at {bootstrap.confidence}, not at 1 - alpha")
    return decide_noninferiority(
        bootstrap.difference, bootstrap.lower, bootstrap.n, margin=margin, alpha=alpha
    )
