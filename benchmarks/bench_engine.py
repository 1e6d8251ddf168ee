"""Engine speed, measured side by side in one run (issues: RidgeFill backend; benchmarks).

Prints, for a random-weight Llama-style model (hidden 512, 16 layers, S = L/2)
on a word-like prompt of the project's byte-level test tokenizer:
  - the partial path with every row exact / plain forward  (target <= 1.05): the engine's own
    overhead (lower layers stopped at the split, selection, late layers run piece by piece),
    bitwise the same result (`rf_eval.engine.partial_every_row_exact`, paper sections 4.3, 9);
    `prefill` of the exact arm dispatches to the plain forward, so exact / plain would be A/A
  - ridge-arm speedup over exact, as a share of the MAC-model ceiling (target >= 0.90), beside 1/r
  - the same for ridge + 10% attention-selected rows and for the probe
    (`probe+special`), each against the ceiling the cost model gives with the
    rows it chose (the probe also against the ceiling charged its probe sweep)
  - capture pass / plain forward                           (target <= 1.25)
  - peak RSS of a fit over 10 and over 50 documents        (flat)
The arms are timed round-robin (one run of each per round, the order rotated
each round, after one warm-up run of each), so load from other processes
falls on every arm alike; figures are medians over --repeats rounds.
  python benchmarks/bench_engine.py [--n 4096 8192 16384] [--repeats 5] [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
from bench_rows import make_prompt
from transformers import LlamaConfig, LlamaForCausalLM

from rf_eval.cost.mac_model import ceiling_r, speedup_ceiling
from rf_eval.engine import Plan, PredictedInput, partial_every_row_exact, plain_prefill, prefill
from rf_eval.ridge.capture import capture_sums
from rf_eval.ridge.maps import RidgeMaps, config_hash
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.testing import build_tokenizer

PROBE_ROWS = 256  # the probe's sweep rows (rf_eval.selectors.probe default)


def make_model(layers: int, hidden: int, device: str, dtype: torch.dtype, vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64,
                      vocab_size=vocab, max_position_embeddings=65536)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def timed_round_robin(arms: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, float]:
    """Median seconds per arm: one warm-up run each, then `repeats` rounds of one run each, order rotated."""
    return {name: statistics.median(ts) for name, ts in round_robin_times(arms, repeats, device).items()}


def round_robin_times(arms: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, list[float]]:
    """Each arm's seconds in each of `repeats` rounds (one run of each per round, the order rotated), after one
    warm-up run of each."""
    def once(fn) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    names = list(arms)
    for name in names:
        once(arms[name])
    seen: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            seen[name].append(once(arms[name]))
    return seen


def random_maps(model, split: int) -> RidgeMaps:
    d, L = model.config.hidden_size, model.config.num_hidden_layers
    g = torch.Generator().manual_seed(1)
    A = {i: torch.eye(d) + 0.01 * torch.randn(d, d, generator=g) for i in range(split, L)}
    b = {i: torch.zeros(d) for i in range(split, L)}
    return RidgeMaps(split, A, b, {"config_hash": config_hash(model.config)})


def fit_peak_rss(n_docs: int, doc_tokens: int, layers: int, hidden: int, vocab: int) -> float:
    """Peak RSS (MiB) of a child process that captures sums over n_docs documents."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys, resource, torch; sys.path.insert(0, {here!r});"
        "from bench_engine import make_model; from rf_eval.ridge.capture import capture_sums;"
        f"m = make_model({layers}, {hidden}, 'cpu', torch.float32, {vocab}); g = torch.Generator().manual_seed(0);"
        f"docs = (torch.randint(0, {vocab}, (1, {doc_tokens}), generator=g) for _ in range({n_docs}));"
        f"capture_sums(m, docs, [{layers // 2}]);"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, nargs="+", default=[8192], help="prompt lengths (one block each)")
    p.add_argument("--tail", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--fit-doc-tokens", type=int, default=512)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device.startswith("cuda") else torch.float32)
    tokenizer = build_tokenizer()
    model = make_model(a.layers, a.hidden, a.device, dtype, len(tokenizer))
    S, T, L = a.layers // 2, a.tail, a.layers
    fill = random_maps(model, S).fill_fn(dtype, a.device)
    rows: dict[str, tuple[float, str]] = {}
    times: list[str] = []
    for N in a.n:
        block = measure_length(model, tokenizer, N, S, T, L, fill, a, times)
        print(times[-1], flush=True)  # each length as it finishes (the long ones take a while on a CPU)
        rows.update(block)
    if not a.skip_memory:
        m10 = fit_peak_rss(10, a.fit_doc_tokens, a.layers, a.hidden, len(tokenizer))
        m50 = fit_peak_rss(50, a.fit_doc_tokens, a.layers, a.hidden, len(tokenizer))
        rows["fit peak RSS, 10 docs (MiB)"] = (m10, "")
        rows["fit peak RSS, 50 docs (MiB)"] = (m50, "")
        rows["fit peak RSS 50 / 10 docs"] = (m50 / m10, "~1.0 (flat)")
    print(f"# model: Llama-style L={L} d={a.hidden}, S={S}, T={T}, {a.device} {dtype}, "
          f"torch threads={torch.get_num_threads()}, cores={os.cpu_count()}, "
          f"{platform.processor() or platform.machine()}")
    for line in times:
        print(line)
    for name, (value, target) in rows.items():
        print(f"{name:52s} {value:10.3f}   {target}")
    if a.json:
        with open(a.json, "w") as fh:
            figures = {k: v for k, (v, _) in rows.items()}
            figures["targets"] = {k: t for k, (_, t) in rows.items() if t}
            json.dump(figures, fh, indent=1)


def measure_length(model, tokenizer, N: int, S: int, T: int, L: int, fill, a, times: list[str]) -> dict:
    """Side-by-side timings at one prompt length; ratios are formed within this one run."""
    ids = make_prompt(tokenizer, N).to(a.device)
    layers = [i for i in (3, 7, 11, 15) if i < S] or [S - 1]
    spec = f"attention(share=0.1;layers={'|'.join(map(str, layers))})"
    plan = Plan(S, T, "ridge")
    rows_arm = partial(prefill_arm, model, tokenizer, RidgeFillArm(fill="ridge", split=S, tail=T, selector=spec))
    unigram = torch.randint(0, 1000, (len(tokenizer),), generator=torch.Generator().manual_seed(2))
    probe_arm = partial(prefill_arm, model, tokenizer,
                        RidgeFillArm(fill="ridge", split=S, tail=T, selector="probe+special"),
                        resources={"unigram": unigram})
    with torch.no_grad():
        n_rows = int(rows_arm(ids, plan, PredictedInput(fill)).exact_rows.numel()) - T
        n_probe = int(probe_arm(ids, plan, PredictedInput(fill)).exact_rows.numel()) - T

    median = timed_round_robin({
        "plain": lambda: plain_prefill(model, ids),
        "exact": lambda: prefill(model, ids, Plan(S, T, "exact")),
        "partial exact": lambda: partial_every_row_exact(model, ids, S),
        "ridge": lambda: prefill(model, ids, plan, fill=fill),
        "ridge+rows": lambda: rows_arm(ids, plan, PredictedInput(fill)),
        "probe": lambda: probe_arm(ids, plan, PredictedInput(fill)),
        "forward": lambda: model.model(input_ids=ids, use_cache=False),
        "capture": lambda: capture_sums(model, [ids], [S]),
    }, a.repeats, a.device)
    exact = median["exact"]
    config = model.config
    ceiling = speedup_ceiling(config, N, split=S, tail=T, fill="ridge")
    ceiling_rows = speedup_ceiling(config, N, split=S, tail=T, fill="ridge", exact_rows=n_rows)
    ceiling_probe = speedup_ceiling(config, N, split=S, tail=T, fill="ridge", exact_rows=n_probe)
    ceiling_probe_sweep = speedup_ceiling(config, N, split=S, tail=T, fill="ridge", exact_rows=n_probe,
                                          probe_rows=PROBE_ROWS)
    times.append(f"# N={N} (median of {a.repeats} rounds): " + " ".join(f"{k} {v:.3f}s" for k, v in median.items())
                 + f"; rows arm {n_rows} rows, probe {n_probe} rows ({n_probe / (N - T):.1%} of the prefix)")
    return {
        f"N={N} partial path, every row exact / plain forward": (median["partial exact"] / median["plain"], "<= 1.05"),
        f"N={N} ridge speedup over exact": (exact / median["ridge"], ""),
        f"N={N} ridge MAC ceiling": (ceiling, ""),
        f"N={N} ridge speedup / MAC ceiling": (exact / median["ridge"] / ceiling, ">= 0.90"),
        f"N={N} ridge speedup / (1/r)": (exact / median["ridge"] * ceiling_r(L, S, T, N), ""),
        f"N={N} 1/r (layer-pass ceiling)": (1 / ceiling_r(L, S, T, N), ""),
        f"N={N} ridge+10% rows: exact rows": (n_rows, ""),
        f"N={N} ridge+10% rows speedup over exact": (exact / median["ridge+rows"], ""),
        f"N={N} ridge+10% rows MAC ceiling": (ceiling_rows, ""),
        f"N={N} ridge+10% rows speedup / MAC ceiling": (exact / median["ridge+rows"] / ceiling_rows, ">= 0.90"),
        f"N={N} probe: exact rows": (n_probe, ""),
        f"N={N} probe speedup over exact": (exact / median["probe"], ""),
        f"N={N} probe MAC ceiling with its rows": (ceiling_probe, ""),
        f"N={N} probe speedup / MAC ceiling with its rows": (exact / median["probe"] / ceiling_probe, ">= 0.90"),
        f"N={N} probe speedup / MAC ceiling with rows + sweep": (exact / median["probe"] / ceiling_probe_sweep, ""),
        f"N={N} capture pass / plain forward": (median["capture"] / median["forward"], "<= 1.25"),
    }


if __name__ == "__main__":
    main()
