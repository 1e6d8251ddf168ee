"""Paired bootstrap throughput: rf_eval.stats against scipy.stats.bootstrap on the same work.

The work: 20 paired comparisons (arms against one reference) on 500 items each,
10,000 percentile resamples per comparison (paper section 3.4). Target: under
1 second for all 20. Each figure is the median of --repeats timed runs after
one warm-up, in this process: wall-clock seconds, and the process's CPU
seconds (which stay meaningful when other processes share the cores).

    python benchmarks/bench_bootstrap.py [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import scipy
from scipy import stats

from rf_eval.stats.bootstrap import paired_bootstrap, paired_bootstraps

N_ITEMS, N_COMPARISONS, N_RESAMPLES = 500, 20, 10_000


def make_data(seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """A reference and 20 arms of per-item accuracy in points (0/100), and 4 task strata."""
    rng = np.random.default_rng(seed)
    ref = (rng.random(N_ITEMS) < 0.8) * 100.0
    arms = {f"arm{i:02d}": np.where(rng.random(N_ITEMS) < 0.02 + 0.01 * i, 100.0 - ref, ref) for i in range(N_COMPARISONS)}
    strata = np.repeat(np.array(["niah_single_1", "niah_multikey_1", "niah_multivalue", "niah_multiquery"]), N_ITEMS // 4)
    return ref, arms, strata


def _mean_diff(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a - b, axis=axis)


def workloads(ref: np.ndarray, arms: dict[str, np.ndarray], strata: np.ndarray) -> dict[str, Callable[[], object]]:
    def ours_separate() -> object:
        return [paired_bootstrap(a, ref, n_resamples=N_RESAMPLES, seed=i) for i, a in enumerate(arms.values())]

    def ours_separate_strata() -> object:
        return [paired_bootstrap(a, ref, strata=strata, n_resamples=N_RESAMPLES, seed=i) for i, a in enumerate(arms.values())]

    def ours_shared() -> object:
        return paired_bootstraps(arms, ref, n_resamples=N_RESAMPLES, seed=0)

    def scipy_separate() -> object:
        return [
            stats.bootstrap(
                (a, ref), _mean_diff, paired=True, vectorized=True, n_resamples=N_RESAMPLES,
                method="percentile", confidence_level=0.95, rng=np.random.default_rng(i),
            ).confidence_interval
            for i, a in enumerate(arms.values())
        ]  # fmt: skip

    return {
        "rf_eval paired_bootstrap, one index matrix per comparison": ours_separate,
        "rf_eval paired_bootstrap, same, resampled within 4 task strata": ours_separate_strata,
        "rf_eval paired_bootstraps, one index matrix shared by the 20 arms": ours_shared,
        "scipy.stats.bootstrap(paired=True, method='percentile'), per comparison": scipy_separate,
    }


def time_it(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of each timed run (after one warm-up)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return wall, cpu


def check_agreement(ref: np.ndarray, arms: dict[str, np.ndarray]) -> float:
    """Largest |bound difference| between ours and scipy over the 20 comparisons, in points."""
    worst = 0.0
    for i, a in enumerate(arms.values()):
        ours = paired_bootstrap(a, ref, n_resamples=N_RESAMPLES, seed=i)
        ci = stats.bootstrap(
            (a, ref), _mean_diff, paired=True, vectorized=True, n_resamples=N_RESAMPLES,
            method="percentile", rng=np.random.default_rng(i),
        ).confidence_interval  # fmt: skip
        worst = max(worst, abs(ours.low - ci.low), abs(ours.high - ci.high))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after one warm-up (default 5)")
    parser.add_argument("--json", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    ref, arms, strata = make_data()
    rows = []
    for name, fn in workloads(ref, arms, strata).items():
        t, cpu = time_it(fn, args.repeats)
        rows.append({"method": name, "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                     "median_cpu_s": statistics.median(cpu)})  # fmt: skip
    scipy_median = rows[-1]["median_s"]
    for row in rows:
        row["speedup_vs_scipy"] = scipy_median / row["median_s"]
    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    print(
        f"paired bootstrap: {N_COMPARISONS} comparisons x {N_ITEMS} items x {N_RESAMPLES:,} resamples; "
        f"median of {args.repeats} runs after a warm-up"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}, scipy {scipy.__version__}; {threads}")
    width = max(len(r["method"]) for r in rows)
    print(f"load average {os.getloadavg()[0]:.1f} (other processes share the cores: compare the cpu column)")
    print(f"{'method'.ljust(width)}  {'median s':>9}  {'min s':>7}  {'max s':>7}  {'cpu s':>7}  {'vs scipy':>9}")
    for r in rows:
        print(
            f"{r['method'].ljust(width)}  {r['median_s']:9.3f}  {r['min_s']:7.3f}  {r['max_s']:7.3f}  "
            f"{r['median_cpu_s']:7.3f}  {r['speedup_vs_scipy']:8.1f}x"
        )
    wall, cpu = rows[0]["median_s"], rows[0]["median_cpu_s"]
    print(
        f"target < 1 s for the 20 comparisons, one index matrix each: wall {wall:.2f} s "
        f"({'met' if wall < 1 else 'NOT met'}), cpu {cpu:.2f} s ({'met' if cpu < 1 else 'NOT met'})"
    )
    print(f"largest interval-bound difference from scipy over the 20 comparisons: {check_agreement(ref, arms):.2f} points")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"work": [N_COMPARISONS, N_ITEMS, N_RESAMPLES], "repeats": args.repeats, "cores": os.cpu_count(), "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
