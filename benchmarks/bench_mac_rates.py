"""How fast a MAC of causal attention runs against a MAC of a linear layer, per prompt length (#55 item 6).

The MAC model (RidgeFill paper section 2.5) counts attention as 2 x heads x head_dim per causal (query, key)
pair and a linear layer as its weights times its rows; a speedup ceiling from those counts assumes every MAC
takes the same time. Where attention's MACs run slower (the softmax between the two products is not counted),
a method that cuts attention more than the linear layers (a dropper, whose kept rows attend among themselves)
can beat its MAC ceiling. This prints, in one process, the rate of each on the embedded model's shapes
(SmolLM2-135M: 9 query heads, 3 key-value heads, head_dim 64, hidden 576, MLP 1,536) and their ratio.

  python benchmarks/bench_mac_rates.py [--lengths 1024 4096 8192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def rate(run: Callable[[], object], macs: float, repeats: int) -> float:
    """Billions of MACs per second: `macs` over the mean of `repeats` runs after a warm-up."""
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return macs / ((time.perf_counter() - start) / repeats) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    heads, kv_heads, dim, hidden, mlp = 9, 3, 64, 576, 1536
    print(f"{torch.get_num_threads()} threads; GMAC/s of causal SDPA and of a {hidden} x {mlp} linear layer")
    for n in a.lengths:
        q, k, v = (torch.randn(1, h, n, dim) for h in (heads, kv_heads, kv_heads))
        attend = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=True)
        attention = rate(attend, 2 * heads * dim * n * (n + 1) / 2, a.repeats)
        linear = rate(functools.partial(F.linear, torch.randn(n, hidden), torch.randn(mlp, hidden)),
                      n * hidden * mlp, a.repeats)
        print(f"N={n:>6}: attention {attention:6.1f}, linear {linear:6.1f}; an attention MAC takes "
              f"{linear / attention:.2f} x a linear MAC's time", flush=True)


if __name__ == "__main__":
    main()
