"""Engine speed, measured side by side in one run (issue: RidgeFill backend).

Prints, for a random-weight Llama-style model (hidden >= 512, >= 16 layers):
  - engine exact prefill / plain transformers forward      (target <= 1.03)
  - ridge-arm speedup over exact, as a share of the MAC-model ceiling (target >= 0.90), beside 1/r
  - capture pass / plain forward                           (target <= 1.25)
  - peak RSS of a fit over 10 and over 50 documents        (flat)
  - the same for ridge + 10% attention-selected rows, against the ceiling with those rows
Medians of --repeats runs after one warm-up. Usage:
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

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rf_eval.capture import capture_sums
from rf_eval.cost import ceiling_r, speedup_ceiling
from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.maps import RidgeMaps, config_hash


def make_model(layers: int, hidden: int, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64,
                      vocab_size=4096, max_position_embeddings=65536)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def timed(fn, repeats: int, device: str) -> float:
    def once():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats))


def random_maps(model, split: int) -> RidgeMaps:
    d, L = model.config.hidden_size, model.config.num_hidden_layers
    g = torch.Generator().manual_seed(1)
    A = {i: torch.eye(d) + 0.01 * torch.randn(d, d, generator=g) for i in range(split, L)}
    b = {i: torch.zeros(d) for i in range(split, L)}
    return RidgeMaps(split, A, b, {"config_hash": config_hash(model.config)})


def fit_peak_rss(n_docs: int, doc_tokens: int, layers: int, hidden: int) -> float:
    """Peak RSS (MiB) of a child process that captures sums over n_docs documents."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys, resource, torch; sys.path.insert(0, {here!r});"
        "from bench_engine import make_model; from rf_eval.capture import capture_sums;"
        f"m = make_model({layers}, {hidden}, 'cpu', torch.float32); g = torch.Generator().manual_seed(0);"
        f"docs = (torch.randint(0, 4096, (1, {doc_tokens}), generator=g) for _ in range({n_docs}));"
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
    model = make_model(a.layers, a.hidden, a.device, dtype)
    S, T, L = a.layers // 2, a.tail, a.layers
    fill = random_maps(model, S).fill_fn(dtype, a.device)
    rows: dict[str, tuple[float, str]] = {}
    times: list[str] = []
    for N in a.n:
        rows.update(measure_length(model, N, S, T, L, fill, a, times))
    if not a.skip_memory:
        m10 = fit_peak_rss(10, a.fit_doc_tokens, a.layers, a.hidden)
        m50 = fit_peak_rss(50, a.fit_doc_tokens, a.layers, a.hidden)
        rows["fit peak RSS, 10 docs (MiB)"] = (m10, "")
        rows["fit peak RSS, 50 docs (MiB)"] = (m50, "")
        rows["fit peak RSS 50 / 10 docs"] = (m50 / m10, "~1.0 (flat)")
    print(f"# model: Llama-style L={L} d={a.hidden}, S={S}, T={T}, {a.device} {dtype}, "
          f"torch threads={torch.get_num_threads()}, cores={os.cpu_count()}, "
          f"{platform.processor() or platform.machine()}")
    for line in times:
        print(line)
    for name, (value, target) in rows.items():
        print(f"{name:44s} {value:10.3f}   {target}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({k: v for k, (v, _) in rows.items()}, fh, indent=1)


def measure_length(model, N: int, S: int, T: int, L: int, fill, a, times: list[str]) -> dict:
    """Side-by-side timings at one prompt length; ratios are formed within this one run."""
    from rf_eval.api import RidgeFill

    ids = torch.randint(0, 4096, (1, N), generator=torch.Generator().manual_seed(0)).to(a.device)
    layers = [i for i in (3, 7, 11, 15) if i < S] or [S - 1]
    spec = f"attention(share=0.1;layers={'|'.join(map(str, layers))})"
    with_rows_arm = RidgeFill(model, maps=random_maps(model, S), tail=T, fill="ridge", selector=spec)
    n_rows = int(with_rows_arm.prefill(ids).exact_rows.numel()) - T

    plain = timed(lambda: plain_prefill(model, ids), a.repeats, a.device)
    exact = timed(lambda: prefill(model, ids, Plan(S, T, "exact")), a.repeats, a.device)
    ridge = timed(lambda: prefill(model, ids, Plan(S, T, "ridge"), fill=fill), a.repeats, a.device)
    with_rows = timed(lambda: with_rows_arm.prefill(ids), a.repeats, a.device)

    def forward_only():
        with torch.no_grad():
            model.model(input_ids=ids, use_cache=False)

    forward = timed(forward_only, a.repeats, a.device)
    capture = timed(lambda: capture_sums(model, [ids], [S]), a.repeats, a.device)
    ceiling = speedup_ceiling(model.config, N, split=S, tail=T, fill="ridge")
    ceiling_rows = speedup_ceiling(model.config, N, split=S, tail=T, fill="ridge", exact_rows=n_rows)
    times.append(f"# N={N} (median of {a.repeats}): plain {plain:.3f}s exact {exact:.3f}s ridge {ridge:.3f}s "
                 f"ridge+rows {with_rows:.3f}s ({n_rows} rows) forward {forward:.3f}s capture {capture:.3f}s")
    return {
        f"N={N} engine exact / plain forward": (exact / plain, "<= 1.03"),
        f"N={N} ridge speedup over exact": (exact / ridge, ""),
        f"N={N} ridge speedup / MAC ceiling": (exact / ridge / ceiling, ">= 0.90"),
        f"N={N} ridge speedup / (1/r)": (exact / ridge * ceiling_r(L, S, T, N), ""),
        f"N={N} 1/r (layer-pass ceiling)": (1 / ceiling_r(L, S, T, N), ""),
        f"N={N} ridge+10% rows speedup / MAC ceiling": (exact / with_rows / ceiling_rows, ">= 0.90"),
        f"N={N} capture pass / plain forward": (capture / forward, "<= 1.25"),
    }


if __name__ == "__main__":
    main()
