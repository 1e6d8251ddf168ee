"""Every method's measured prefill speedup against its MAC ceiling, side by side in one process (#55 item 6).

On the embedded SmolLM2-135M-Instruct (or `--model PATH`), for each prompt length (1,024, 4,096 and 8,192
tokens by default) and each method that runs on a model alone (the droppers, presets and sparse-attention
methods at their defaults, RidgeFill's fills at a quarter tail, and the identity fill with FlexPrefill in its
exact layers; `--methods` picks some): the exact prefill and every method's prefill of one word-like prompt
are timed round-robin (one warm-up each, then `--repeats` rounds, the order rotated each round), so load from
other processes falls on all of them alike.
Per method and length it prints the measured speedup (the median of exact's times over the median of the
method's), the MAC model's ceiling for the rows the prefill ran (`Method.prefill_cost`), their ratio (the
share of the ceiling reached) and its spread over the rounds (each round's exact time over the same round's
method time, min and max). A share above 1 in every round is flagged (a measured speedup the MAC count does
not allow: the cost model or the exact path is off), and one below 0.85 in every round (the method's time
goes somewhere its MACs do not say).

  python benchmarks/bench_methods.py [--lengths 1024 4096 8192] [--repeats 3] [--methods ...] [--device cpu]
      [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from bench_engine import round_robin_times

from rf_eval.methods import method_class

#: the arms: (name, method, its fields at prompt length n)
ARMS = [
    ("identity", "ridgefill", lambda n: {"fill": "identity", "tail": n // 4}),
    ("nofill", "ridgefill", lambda n: {"fill": "nofill", "tail": n // 4}),
    ("pop", "pop", lambda n: {}),
    ("fastkv", "fastkv", lambda n: {}),
    ("gemfilter", "gemfilter", lambda n: {}),
    ("flexprefill", "flexprefill", lambda n: {}),
    ("xattention", "xattention", lambda n: {}),
    ("sinkwindow", "sinkwindow", lambda n: {}),
    # a fill with a sparse part: the pattern in the lower layers' every row and the late layers' tail rows
    ("identity+flexprefill", "ridgefill", lambda n: {"fill": "identity", "tail": n // 4, "sparse": "flexprefill"}),
]
LOW_SHARE = 0.85


def prompt_ids(tokenizer: Any, n: int) -> torch.Tensor:
    """n tokens of repeated English text (word-like, as a real prompt's)."""
    text = " ".join(f"The report on item {i} was filed on a quiet Tuesday in the spring." for i in range(n // 8 + 8))
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :n]
    if ids.shape[1] < n:
        raise SystemExit(f"the text gives {ids.shape[1]} tokens, fewer than {n}")
    return ids


def measure(model: Any, tokenizer: Any, n: int, repeats: int, device: str, names: list[str]
            ) -> list[dict[str, Any]]:
    ids = prompt_ids(tokenizer, n).to(device)
    methods = {"exact": method_class("exact")(model, tokenizer)}
    for name, method, fields in ARMS:
        if name in names:
            methods[name] = method_class(method)(model, tokenizer, **fields(n))
    ceilings = {name: m.prefill_cost(n, m.prefill(ids)).mac_speedup for name, m in methods.items() if name != "exact"}
    seen = round_robin_times({name: (lambda m=m: m.prefill(ids)) for name, m in methods.items()}, repeats, device)
    names = list(seen)
    exact = statistics.median(seen["exact"])
    rows = []
    for name in names[1:]:
        speedup = exact / statistics.median(seen[name])
        per_round = [e / t / ceilings[name] for e, t in zip(seen["exact"], seen[name])]
        share = speedup / ceilings[name]
        rows.append({"method": name, "length": n, "measured": speedup, "ceiling": ceilings[name], "share": share,
                     "spread": [min(per_round), max(per_round)],
                     "flag": "above the ceiling" if min(per_round) > 1 else "far below" if max(per_round) < LOW_SHARE
                     else ""})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder or hub name (default: the embedded demo model)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    parser.add_argument("--methods", nargs="+", default=None, choices=[name for name, _, _ in ARMS],
                        help="the methods timed beside exact (default: all)")
    a = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.demo.model import resolve_pretrained

    path = resolve_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, a.dtype)).to(a.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    print(f"{path}: {a.device}, {torch.get_num_threads()} threads, {a.repeats} rounds after a warm-up")
    print(f"{'method':<20} {'length':>6} {'measured':>9} {'ceiling':>8} {'share':>6} {'spread':>13}", flush=True)
    rows = []
    names = a.methods or [name for name, _, _ in ARMS]
    for n in a.lengths:  # each length's rows as they come: a long length on a CPU takes minutes
        rows += measure(model, tokenizer, n, a.repeats, a.device, names)
        for r in rows[-len(names):]:
            lo, hi = r["spread"]
            print(f"{r['method']:<20} {r['length']:>6} {r['measured']:>8.2f}x {r['ceiling']:>7.2f}x {r['share']:>6.2f} "
                  f"[{lo:.2f}, {hi:.2f}] {r['flag']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
