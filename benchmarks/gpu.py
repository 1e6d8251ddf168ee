"""The speed table on one GPU, in one command that fits a short slot: random weights at real layer shapes
(the vocabulary is the test tokenizer's, so the head is small), nothing downloaded, every ratio measured
side by side in one process.

  python benchmarks/gpu.py [--shape llama-3.1-8b|hybrid] [--quick] [--out DIR]
  python benchmarks/gpu.py --tiny --device cpu --out DIR      # the same fields at a toy size (CI)

For each prompt length N (8K, 32K, and 64K where the memory allows; `--quick`: 8K and 32K, fewer rounds)
at split S = L/2 and the paper's tail (4096; the tiny shape: N/4), as medians of rounds interleaved in
one process (`bench_engine.timed_round_robin`): the plain forward, the partial path with every row exact,
exact, identity, ridge, ridge + 10% attention-selected rows and the probe; each arm's speedup over exact
against 1/r and the MAC-model ceiling; peak device memory of ridge against the plain forward; ridge with
its maps streamed from host memory (`maps_device=cpu`) against maps resident on the device; the capture
pass's throughput (tokens/s); 8 prompts of one length in one engine call against one call each (prompts/s,
plain forward and ridge); and, once, the engine floor in the run's dtype: max |Δ| and KL of the
filled arms' attention kernel with every row exact against the stock model, and the greedy tokens that
flip over 64 decoded tokens. Writes `gpu.json` and `gpu.md` (the Markdown table) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch
from bench_engine import random_maps, timed_round_robin
from bench_rows import make_prompt

from rf_eval.cost.mac_model import ceiling_r, speedup_ceiling
from rf_eval.engine import Plan, PredictedInput, extend, partial_every_row_exact, plain_prefill, prefill
from rf_eval.engine.floor import compare_results, filled_kernel_every_row_exact
from rf_eval.ridge.capture import capture_sums
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.testing import build_tokenizer

#: model shapes: transformers config class name and its arguments (random weights at these shapes)
SHAPES = {
    "llama-3.1-8b": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                         rope_theta=500000.0, max_position_embeddings=131072)),
    # a Qwen3.5-style hybrid: three Gated DeltaNet layers to one gated attention layer
    "hybrid": ("Qwen3NextConfig", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                       num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                                       linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                                       linear_num_key_heads=16, linear_num_value_heads=32, num_experts=0,
                                       layer_types=["linear_attention"] * 3 + ["full_attention"],
                                       max_position_embeddings=131072)),
    "tiny": ("LlamaConfig", dict(hidden_size=128, intermediate_size=384, num_hidden_layers=8, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=64, max_position_embeddings=8192)),
}
DECODED = 64  # greedy tokens compared for the engine floor
BATCH = 8  # prompts of one batch (lm-eval's --batch_size 8)
ARMS = ("plain", "partial exact", "exact", "identity", "ridge", "ridge+rows", "probe", "ridge streamed")


def build_model(shape: str, device: str, dtype: torch.dtype, vocab: int):
    import transformers

    name, fields = SHAPES[shape]
    fields = dict(fields)
    if "layer_types" in fields:
        pattern = fields.pop("layer_types")
        fields["layer_types"] = (pattern * fields["num_hidden_layers"])[: fields["num_hidden_layers"]]
    config = getattr(transformers, name)(vocab_size=vocab, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def peak_memory(fn, device: str) -> float | None:
    """Peak device memory (GiB) while `fn` runs; None off CUDA (no per-call peak to read)."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def greedy(model, result, steps: int) -> list[int]:
    """`steps` greedy tokens after a prefill, one stock decoding step at a time."""
    tokens, logits = [], result.logits
    with torch.no_grad():
        for _ in range(steps):
            token = int(logits[0].argmax())
            tokens.append(token)
            logits = extend(model, result, torch.tensor([[token]], device=logits.device))[:, -1]
    return tokens


def fits(model, n: int, device: str) -> bool:
    """Whether an n-token prompt's plain forward should fit the device (its cache and a few activations)."""
    if not device.startswith("cuda"):
        return True
    config = model.config
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * n * 2
    acts = 8 * n * max(config.hidden_size, config.intermediate_size) * 2
    free, _ = torch.cuda.mem_get_info()
    return kv + acts < 0.8 * free


def measure(model, tokenizer, n: int, split: int, tail: int, repeats: int, device: str, dtype) -> dict:
    config, layers = model.config, model.config.num_hidden_layers
    ids = make_prompt(tokenizer, n).to(device)
    maps = random_maps(model, split)
    resident, streamed = maps.fill_fn(dtype, device), maps.on_host().fill_fn(dtype, device)
    attention_layers = [i for i in range(split) if (getattr(config, "layer_types", None) or ["full_attention"] *
                                                     layers)[i] == "full_attention"][-2:] or [split - 1]
    rows_arm = partial(prefill_arm, model, tokenizer, RidgeFillArm(
        fill="ridge", split=split, tail=tail,
        selector=f"attention(share=0.1;layers={'|'.join(map(str, attention_layers))})"))
    probe_arm = partial(prefill_arm, model, tokenizer,
                        RidgeFillArm(fill="ridge", split=split, tail=tail, selector="probe+special"),
                        resources={"unigram": torch.randint(0, 1000, (len(tokenizer),),
                                                            generator=torch.Generator().manual_seed(2))})
    plan = Plan(split, tail, "ridge")
    with torch.no_grad():
        n_rows = int(rows_arm(ids, plan, PredictedInput(resident)).exact_rows.numel()) - tail
        n_probe = int(probe_arm(ids, plan, PredictedInput(resident)).exact_rows.numel()) - tail
    arms = {
        "plain": lambda: plain_prefill(model, ids),
        "partial exact": lambda: partial_every_row_exact(model, ids, split),
        "exact": lambda: prefill(model, ids, Plan(split, tail, "exact")),
        "identity": lambda: prefill(model, ids, Plan(split, tail, "identity"), fill=lambda layer, x: x),
        "ridge": lambda: prefill(model, ids, plan, fill=resident),
        "ridge+rows": lambda: rows_arm(ids, plan, PredictedInput(resident)),
        "probe": lambda: probe_arm(ids, plan, PredictedInput(resident)),
        "ridge streamed": lambda: prefill(model, ids, plan, fill=streamed),
    }
    median = timed_round_robin(arms, repeats, device)
    t = time.perf_counter()
    with torch.no_grad():
        capture_sums(model, [ids], [split])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    capture_s = time.perf_counter() - t
    exact = median["exact"]
    ceilings = {"identity": speedup_ceiling(config, n, split=split, tail=tail, fill="identity"),
                "ridge": speedup_ceiling(config, n, split=split, tail=tail, fill="ridge"),
                "ridge+rows": speedup_ceiling(config, n, split=split, tail=tail, fill="ridge", exact_rows=n_rows),
                "probe": speedup_ceiling(config, n, split=split, tail=tail, fill="ridge", exact_rows=n_probe)}
    one_over_r = 1 / ceiling_r(layers, split, tail, n)
    out = {"N": n, "seconds": median, "exact_rows": {"ridge+rows": n_rows, "probe": n_probe},
           "partial_exact_over_plain": median["partial exact"] / median["plain"],
           "one_over_r": one_over_r, "arms": {}}
    for arm, ceiling in ceilings.items():
        speedup = exact / median[arm]
        out["arms"][arm] = {"speedup": speedup, "mac_ceiling": ceiling, "of_mac_ceiling": speedup / ceiling,
                            "of_one_over_r": speedup / one_over_r}
    plain_peak, ridge_peak = peak_memory(arms["plain"], device), peak_memory(arms["ridge"], device)
    out["peak_memory_gib"] = {"plain": plain_peak, "ridge": ridge_peak,
                              "ridge_over_plain": None if plain_peak is None else ridge_peak / plain_peak}
    out["streamed_over_resident"] = median["ridge streamed"] / median["ridge"]
    out["capture_tokens_per_s"] = n / capture_s
    return out


def batched(model, tokenizer, n: int, split: int, tail: int, batch: int, repeats: int, device: str, dtype) -> dict:
    """Prompts per second of `batch` prompts of one length, one at a time against all in one call (lm-eval's
    `--batch_size`; `rf_eval.engine.batch`), for the plain forward and the ridge arm."""
    ids = torch.cat([make_prompt(tokenizer, n, seed=s) for s in range(batch)]).to(device)
    fill = random_maps(model, split).fill_fn(dtype, device)
    plan = Plan(split, tail, "ridge")

    def plain_batch():
        with torch.no_grad():
            return model(input_ids=ids, use_cache=True, logits_to_keep=1)

    median = timed_round_robin({
        "plain, one at a time": lambda: [plain_prefill(model, ids[b : b + 1]) for b in range(batch)],
        f"plain, batch {batch}": plain_batch,
        "ridge, one at a time": lambda: [prefill(model, ids[b : b + 1], plan, fill=fill) for b in range(batch)],
        f"ridge, batch {batch}": lambda: prefill(model, ids, plan, fill=fill),
    }, repeats, device)
    rate = {arm: batch / seconds for arm, seconds in median.items()}
    return {"N": n, "batch": batch, "prompts_per_s": rate,
            "plain_batch_gain": rate[f"plain, batch {batch}"] / rate["plain, one at a time"],
            "ridge_batch_gain": rate[f"ridge, batch {batch}"] / rate["ridge, one at a time"],
            "ridge_over_plain_batched": rate[f"ridge, batch {batch}"] / rate[f"plain, batch {batch}"]}


def engine_floor(model, tokenizer, n: int, split: int, device: str) -> dict:
    ids = make_prompt(tokenizer, n).to(device)
    with torch.no_grad():
        stock, kernel = plain_prefill(model, ids), filled_kernel_every_row_exact(model, ids, split)
    floor = compare_results(stock, kernel, "")
    a, b = greedy(model, stock, DECODED), greedy(model, kernel, DECODED)
    return {"N": n, "max_abs": floor.max_abs, "kl": floor.kl, "decoded": DECODED,
            "greedy_flipped": sum(x != y for x, y in zip(a, b)),
            "first_flip": next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)}


def markdown(report: dict) -> str:
    head = report["setup"]
    lines = [f"Shape {head['shape']} (L={head['layers']}, d={head['hidden']}), {head['device']} {head['dtype']}, "
             f"S={head['split']}, tail {head['tail']}; medians of {head['repeats']} interleaved rounds.", "",
             "| N | arm | speedup over exact | MAC ceiling | of ceiling | of 1/r |", "|---|---|---|---|---|---|"]
    for block in report["lengths"]:
        for arm, row in block["arms"].items():
            lines.append(f"| {block['N']} | {arm} | {row['speedup']:.2f}x | {row['mac_ceiling']:.2f}x | "
                         f"{row['of_mac_ceiling']:.0%} | {row['of_one_over_r']:.0%} |")
    lines += ["", "| N | partial exact / plain | 1/r | peak memory ridge / plain | streamed / resident maps | "
                  "capture tokens/s |", "|---|---|---|---|---|---|"]
    for block in report["lengths"]:
        peak = block["peak_memory_gib"]["ridge_over_plain"]
        lines.append(f"| {block['N']} | {block['partial_exact_over_plain']:.3f} | {block['one_over_r']:.2f}x | "
                     f"{'-' if peak is None else f'{peak:.2f}'} | {block['streamed_over_resident']:.3f} | "
                     f"{block['capture_tokens_per_s']:.0f} |")
    b = report["batched"]
    lines += ["", f"Batch {b['batch']} at N={b['N']} (prompts/s, one engine call against one per prompt): "
                  f"plain {b['plain_batch_gain']:.2f}x, ridge {b['ridge_batch_gain']:.2f}x; ridge / plain both "
                  f"batched {b['ridge_over_plain_batched']:.2f}x."]
    f = report["engine_floor"]
    lines += ["", f"Engine floor at N={f['N']} ({head['dtype']}): max |Δ| {f['max_abs']:.3g}, KL {f['kl']:.3g} nats, "
                  f"{f['greedy_flipped']} of {f['decoded']} greedy tokens flipped."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=[s for s in SHAPES if s != "tiny"], default="llama-3.1-8b")
    p.add_argument("--tiny", action="store_true", help="the toy shape at toy lengths: every field, in seconds")
    p.add_argument("--quick", action="store_true", help="8K and 32K, 2 rounds (under 3 minutes on an H100)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--out", default="build/gpu")
    a = p.parse_args(argv)
    shape = "tiny" if a.tiny else a.shape
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if a.device.startswith("cuda") else torch.float32)
    lengths = [256, 512] if a.tiny else [8192, 32768] if a.quick else [8192, 32768, 65536]
    repeats = 1 if a.tiny else 2 if a.quick else 5
    tokenizer = build_tokenizer()
    t0 = time.perf_counter()
    model = build_model(shape, a.device, dtype, len(tokenizer))
    layers = model.config.num_hidden_layers
    split = layers // 2
    report = {"setup": {"shape": shape, "layers": layers, "hidden": model.config.hidden_size, "device": a.device,
                        "dtype": str(dtype).removeprefix("torch."), "split": split, "repeats": repeats,
                        "tail": None, "torch": torch.__version__, "python": sys.version.split()[0],
                        "machine": torch.cuda.get_device_name() if a.device.startswith("cuda") else
                        (platform.processor() or platform.machine()), "cores": os.cpu_count(),
                        "build_seconds": time.perf_counter() - t0},
              "lengths": [], "skipped_lengths": []}
    for n in lengths:
        tail = n // 4 if a.tiny else 4096
        report["setup"]["tail"] = tail
        if not fits(model, n, a.device):
            report["skipped_lengths"].append(n)
            continue
        report["lengths"].append(measure(model, tokenizer, n, split, tail, repeats, a.device, dtype))
        print(f"N={n} done at {time.perf_counter() - t0:.0f}s", flush=True)
    batch_n = lengths[0] if a.tiny else 2048  # 8 prompts of 2K: the cache of 16K tokens fits beside the model
    report["batched"] = batched(model, tokenizer, batch_n, split, batch_n // 4, BATCH, repeats, a.device, dtype)
    report["engine_floor"] = engine_floor(model, tokenizer, lengths[0], split, a.device)
    report["setup"]["total_seconds"] = time.perf_counter() - t0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=1))
    (out / "gpu.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
