"""Whether the MAC count is a time model on this device: the exact prefill's seconds against its two counts (#55 item 6).

The MAC model (RidgeFill paper section 2.5) counts a prefill as row MACs (every linear layer: its weights times
the rows it runs) plus pair MACs (attention: 2 x heads x head_dim per causal (query, key) pair); a speedup
ceiling from their sum takes a MAC of each kind to cost the same time. Where a pair MAC runs slower, a method
that cuts pairs more than rows (a dropper's kept rows attend among themselves; a sparse pattern skips pairs)
can beat its ceiling; where it runs faster, such a method falls short of it. This times the exact prefill of
the embedded SmolLM2-135M-Instruct (or `--model PATH`) at each length, round-robin in one process, and fits
seconds = a x row MACs + b x pair MACs by least squares, over the medians and over each round: it prints a, b,
their ratio w = b / a with its spread over rounds (1: a MAC is a MAC here), and each length's seconds per GMAC
and residual from the fit. A kernel timed alone would not do: the rows' side of a layer is more than its
largest matrix product (norms, rotary, small projections), and the fit prices all of it.

  python benchmarks/bench_mac_rates.py [--lengths 1024 2048 4096 8192] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
import torch
from bench_engine import round_robin_times
from bench_methods import prompt_ids

from rf_eval.cost.mac_model import causal_pairs, layer_costs


def mac_counts(config: Any, n: int) -> tuple[int, int]:
    """(row MACs, pair MACs) of the exact prefill of an n-token prompt (the last row's logits with the rows)."""
    costs = layer_costs(config)
    rows = sum(n * (c.write + c.rest) for c in costs) + config.hidden_size * config.vocab_size
    return rows, sum(c.attn_per_key * causal_pairs(0, n, c.window) for c in costs)


def fit_rates(counts: list[tuple[int, int]], seconds: list[float]) -> tuple[float, float]:
    """(a, b): seconds per row MAC and per pair MAC, the least-squares fit of seconds = a rows + b pairs."""
    (a, b), *_ = np.linalg.lstsq(np.array(counts, dtype=float), np.array(seconds, dtype=float), rcond=None)
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder or hub name (default: the embedded demo model)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    a = parser.parse_args()
    if len(set(a.lengths)) < 2:
        parser.error("give two lengths or more: the fit has two unknowns")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.demo.model import resolve_pretrained
    from rf_eval.methods import method_class

    path = resolve_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, a.dtype)).to(a.device).eval()
    exact = method_class("exact")(model, AutoTokenizer.from_pretrained(path))
    prompts = {n: prompt_ids(exact.tokenizer, n).to(a.device) for n in a.lengths}
    seen = round_robin_times({n: (lambda ids=ids: exact.prefill(ids)) for n, ids in prompts.items()}, a.repeats,
                             a.device)
    counts = [mac_counts(model.config, n) for n in a.lengths]
    medians = [statistics.median(seen[n]) for n in a.lengths]
    row, pair = fit_rates(counts, medians)
    ratios = [fit_rates(counts, [seen[n][r] for n in a.lengths]) for r in range(a.repeats)]
    ws = [b / a_ for a_, b in ratios]
    print(f"{path}: {a.device}, {torch.get_num_threads()} threads, {a.repeats} rounds after a warm-up; the exact "
          "prefill")
    print(f"{'length':>6} {'seconds':>8} {'row GMAC':>9} {'pair GMAC':>10} {'ms/GMAC':>8} {'residual':>9}")
    for n, (rows, pairs), t in zip(a.lengths, counts, medians):
        print(f"{n:>6} {t:>8.3f} {rows / 1e9:>9.1f} {pairs / 1e9:>10.1f} {t / (rows + pairs) * 1e12:>8.2f} "
              f"{(t / (row * rows + pair * pairs) - 1) * 100:>8.1f}%")
    print(f"fit: a row MAC {row * 1e12:.2f} ms/GMAC, a pair MAC {pair * 1e12:.2f} ms/GMAC; w = {pair / row:.3f} "
          f"[{min(ws):.3f}, {max(ws):.3f} over rounds] (1: a MAC is a MAC on this device)")


if __name__ == "__main__":
    main()
