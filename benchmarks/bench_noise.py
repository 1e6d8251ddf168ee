"""The timing noise floor of this machine: the same prefill timed as two arms (A/A), beside engine exact.

`engine exact` with no filled rows *is* the plain forward (`prefill` returns
`plain_prefill`; tests assert it bitwise), so `exact / plain` measures only
how far two timings of one function drift apart here. This prints that A/A
ratio beside it, from the same round-robin timing bench_engine uses, so a
reader can tell a real overhead from noise.

    python benchmarks/bench_noise.py [--n 4096] [--repeats 5] [--trials 2]
"""

from __future__ import annotations

import argparse

import torch
from bench_engine import make_model, timed_round_robin
from bench_rows import make_prompt

from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.testing import build_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    tok = build_tokenizer()
    model = make_model(16, 512, a.device, torch.float32 if a.device == "cpu" else torch.bfloat16, len(tok))
    ids = make_prompt(tok, a.n).to(a.device)
    for trial in range(a.trials):
        m = timed_round_robin({
            "plain": lambda: plain_prefill(model, ids),
            "plain again": lambda: plain_prefill(model, ids),
            "exact": lambda: prefill(model, ids, Plan(8, 1024, "exact")),
        }, a.repeats, a.device)
        print(f"trial {trial}: " + " ".join(f"{k} {v:.3f}s" for k, v in m.items())
              + f"   A/A {m['plain again'] / m['plain']:.3f}   exact/plain {m['exact'] / m['plain']:.3f}", flush=True)


if __name__ == "__main__":
    main()
