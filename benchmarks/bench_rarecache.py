"""RaReCache prefill time against a full target prefill, as a share of the eq. 11 ceiling (paper 4.6, B.4).

    python benchmarks/bench_rarecache.py [--T 2048] [--rhos 0.2 0.3 0.5] [--repeats 3] [--json FILE]

On CPU, random-weight Llama-style models (the tiny tokenizer; a target of
8 layers, width 1024, 16 heads of 64, 4 KV heads, and a source of 8 layers,
width 512, 2 KV heads; maps K=8, r=128 fitted on a small random corpus) and
one T-token prompt. Per rho, with the rank-disagreement selector:

- `target side` = mapping (de-rotation of the source blocks included) +
  scoring + selection + the target's partial prefill; the source's own
  prefill is not charged (the paper's cascade setting) but is printed;
- speedup = full target prefill / target side, and its share of the eq. 11
  ceiling (P_map, P_probe charged); the target's partial prefill alone against
  eq. 11 with P_map = P_probe = 0;
- mapping + scoring as a share of the target side.

Each time is the minimum over `repeats` runs after a warm-up (the least
disturbed run on a shared machine); full and RaReCache runs alternate. On a
busy machine, time with `--threads 1 --clock cpu` (process CPU time: work
done, not time spent waiting for a core); `--clock wall` for elapsed time.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rf_eval import engine
from rf_eval.rarecache.cost import ceiling_for
from rf_eval.rarecache.fit import fit_transfer
from rf_eval.rarecache.method import RaReCache
from rf_eval.testing import make_tiny_model

TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
              num_key_value_heads=4, head_dim=64)
SOURCE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64)
WORDS = "the of and to in river stone lamp seven blue market paper window forty north clock garden copper".split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build(workdir: Path, T: int):
    target_dir = make_tiny_model("llama", workdir / "target", seed=0, **TARGET)
    source_dir = make_tiny_model("llama", workdir / "source", seed=1, **SOURCE)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    source = AutoModelForCausalLM.from_pretrained(source_dir).eval()
    tok = AutoTokenizer.from_pretrained(target_dir)
    rng = random.Random(0)
    docs = []
    for i in range(4):
        path = workdir / f"calibration{i}.txt"
        path.write_text(text(rng, 100))
        docs.append(str(path))
    maps, _ = fit_transfer(source, target, tok, tok, docs, k=8, rank=128, lam=0.01, stride=1)
    ids = tok(text(rng, T // 4), return_tensors="pt").input_ids[:, :T]  # ~6 bytes a word: >= T tokens
    return target, source, tok, maps, ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--rhos", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: process CPU time (robust on a shared machine; use with --threads 1); wall: elapsed")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        target, source, tok, maps, ids = build(Path(tmp), args.T)
        print(f"built models and fitted maps in {time.perf_counter() - t0:.1f}s; T={ids.shape[1]}, "
              f"threads={torch.get_num_threads()}, P_map+P_probe={sum(maps.parameter_counts()):,}")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    arms = {rho: RaReCache(target, tok, source=source, maps=maps, rho=rho, selector="rank", clock=clock)
            for rho in args.rhos}

    def full_prefill() -> float:
        start = clock()
        engine.plain_prefill(target, ids)
        return clock() - start

    full_prefill()
    for rc in arms.values():
        rc.prefill(ids)  # warm-up
    full: list[float] = []
    runs: dict[float, list[dict]] = {rho: [] for rho in args.rhos}
    for _ in range(args.repeats):
        full.append(full_prefill())
        for rho, rc in arms.items():
            runs[rho].append(rc.prefill(ids).timings)
    t_full = min(full)
    print(f"\n{args.clock} time; full target prefill: {t_full * 1e3:.0f} ms (min of {len(full)})")
    header = ("rho", "target side ms", "speedup", "eq11 ceiling", "share of ceiling", "partial prefill ms",
              "speedup", "ceiling (no map)", "share", "map+score share", "source ms")
    print(" | ".join(header))
    rows = []
    for rho in args.rhos:
        best = {key: min(r[key] for r in runs[rho]) for key in runs[rho][0]}
        side = min(r["target_side"] for r in runs[rho])
        ceiling = ceiling_for(target, maps, ids.shape[1], rho)
        ceiling_target = ceiling_for(target, maps, ids.shape[1], rho, target_side_only=True)
        row = dict(
            rho=rho, full_ms=t_full * 1e3, target_side_ms=side * 1e3, speedup=t_full / side, ceiling=ceiling,
            share_of_ceiling=t_full / side / ceiling, partial_ms=best["target"] * 1e3,
            partial_speedup=t_full / best["target"], ceiling_no_map=ceiling_target,
            partial_share=t_full / best["target"] / ceiling_target,
            map_score_share=(best["map"] + best["score"]) / side, map_ms=best["map"] * 1e3,
            score_ms=best["score"] * 1e3, select_ms=best["select"] * 1e3, source_ms=best["source"] * 1e3,
        )
        rows.append(row)
        print(f"{rho:.1f} | {row['target_side_ms']:.0f} | {row['speedup']:.2f}x | {ceiling:.2f}x | "
              f"{row['share_of_ceiling']:.2f} | {row['partial_ms']:.0f} | {row['partial_speedup']:.2f}x | "
              f"{ceiling_target:.2f}x | {row['partial_share']:.2f} | {row['map_score_share']:.1%} "
              f"(map {row['map_ms']:.0f} ms, score {row['score_ms']:.0f} ms) | {row['source_ms']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"T": ids.shape[1], "threads": torch.get_num_threads(), "clock": args.clock,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
