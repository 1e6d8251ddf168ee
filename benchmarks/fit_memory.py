"""Peak memory of `rf-eval fit` at a model's full hidden size (issue 16, item 4).

For each hidden size d (default 4096 and 8192) it writes a random Llama
config and weights locally (head_dim 128, 8 KV heads, a few layers, small
intermediate size and the project's byte-level tokenizer, so the weights fit
on a small machine), then runs, each in its own child process:
  - a baseline: the CLI's own model loading plus one forward over one
    calibration document (weights + activations + the Python/torch runtime);
  - the real `rf-eval fit` CLI (`rf_eval.cli.main`) with the given --splits.
Peak RSS of each child comes from os.wait4 (ru_maxrss); on CUDA also
torch.cuda.max_memory_allocated. The fit's own memory is fit minus baseline.
It prints that beside `fit_peak_bytes` (rf_eval.ridge.fit_memory: the
fp64 sums plus the solve's working set) and extrapolates the formula to
Llama-3.1-8B and -70B.
With --heldout-memory GIB the fit also chooses lambda from the nine-value grid
on one held-out document, in passes within that budget.
  python benchmarks/fit_memory.py [--hidden 4096 8192] [--layers 4] [--splits 2 3] [--device cpu]
      [--heldout-memory GIB] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rf_eval.ridge.fit_memory import (
    fit_peak_bytes,
    gib,
    heldout_budget,
    lambdas_per_pass,
    maps_bytes,
    sums_bytes,
)
from rf_eval.ridge.sums import LAMBDA_GRID

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "1234", "north", "seven", "quiet", "the", "of"]
REAL_MODELS = (("Llama-3.1-8B", 4096, 32, 16), ("Llama-3.1-70B", 8192, 80, 40))

BASELINE = """
import json, sys, torch
from rf_eval.ridgefill.fit_run import load_fit_model
model, tok = load_fit_model(sys.argv[1], device=sys.argv[2], dtype=sys.argv[3])
text = open(sys.argv[4]).readline()
ids = tok(json.loads(text)["text"], return_tensors="pt", truncation=True, max_length=int(sys.argv[5])).input_ids
with torch.no_grad():
    model.model(input_ids=ids.to(model.device), use_cache=False)
cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
open(sys.argv[6], "w").write(json.dumps({"cuda_peak": cuda}))
"""

FIT = """
import json, sys, torch
from rf_eval.cli import main
rc = main(sys.argv[2:])
cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
open(sys.argv[1], "w").write(json.dumps({"cuda_peak": cuda}))
sys.exit(rc)
"""


def write_model(folder: Path, d: int, layers: int, intermediate: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rf_eval.testing import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(hidden_size=d, num_attention_heads=d // 128, num_key_value_heads=8, head_dim=128,
                         intermediate_size=intermediate, num_hidden_layers=layers, vocab_size=len(tok),
                         max_position_embeddings=4096, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(folder)
    tok.save_pretrained(folder)


def write_documents(path: Path, n_docs: int, n_words: int, seed: int = 0) -> None:
    import random

    rng = random.Random(seed)
    with open(path, "w") as fh:
        for _ in range(n_docs):
            fh.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(n_words))}) + "\n")


def run_child(code: str, args: list[str], env: dict) -> dict:
    """Run `python -c code args`; its peak RSS (bytes) and what it wrote to its result file."""
    result = Path(tempfile.mkstemp(suffix=".json")[1])
    argv = [sys.executable, "-c", code, *[str(result) if a == "{result}" else a for a in args]]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{output}")
    found = json.loads(result.read_text() or "{}")
    result.unlink()
    return {"rss_peak": usage.ru_maxrss * 1024, "output": output, **found}


def measure(d: int, args: argparse.Namespace, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"fitmem{d}_") as tmp:
        tmp = Path(tmp)
        write_model(tmp / "model", d, args.layers, args.intermediate)
        write_documents(tmp / "calib.jsonl", args.docs, args.tokens)
        base = run_child(BASELINE, [str(tmp / "model"), args.device, args.dtype, str(tmp / "calib.jsonl"),
                                    str(args.tokens), "{result}"], env)
        fit_argv = ["fit", "--model", str(tmp / "model"), "--splits", *map(str, args.splits), "--calibration",
                    str(tmp / "calib.jsonl"), "--out", str(tmp / "maps"), "--device", args.device, "--dtype",
                    args.dtype, "--max-tokens", str(args.tokens), "--no-progress"]
        if args.sums_device:
            fit_argv += ["--sums-device", args.sums_device]
        if args.heldout_memory:  # the nine-lambda grid scored on held-out text, in passes within this budget
            write_documents(tmp / "heldout.jsonl", 1, args.tokens, seed=1)
            fit_argv += ["--heldout", str(tmp / "heldout.jsonl"), "--heldout-memory", args.heldout_memory]
        fit = run_child(FIT, ["{result}", *fit_argv], env)
    sums = sums_bytes(d, args.layers, args.splits)
    n_maps = args.layers - min(args.splits)
    n_lambdas, group = 1, None
    if args.heldout_memory:
        budget, _ = heldout_budget(args.heldout_memory)
        n_lambdas = len(LAMBDA_GRID)
        group = lambdas_per_pass(budget, maps_bytes(d, n_maps), n_lambdas)  # the largest split's grouping
    predicted = fit_peak_bytes(d, args.layers, args.splits, n_lambdas, group)
    row = {"d": d, "layers": args.layers, "splits": args.splits, "dtype": args.dtype, "device": args.device,
           "docs": args.docs, "tokens": args.tokens,
           "baseline_rss": base["rss_peak"], "fit_rss": fit["rss_peak"],
           "fit_own_rss": fit["rss_peak"] - base["rss_peak"], "sums_bytes": sums, "predicted_fit_own": predicted,
           "largest_split_maps": n_maps, "heldout_memory": args.heldout_memory, "lambdas_per_pass": group, "fit_output": fit["output"].strip().splitlines()[-3:]}
    if base.get("cuda_peak"):
        row.update(baseline_cuda=base["cuda_peak"], fit_cuda=fit["cuda_peak"],
                   fit_own_cuda=fit["cuda_peak"] - base["cuda_peak"])
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--splits", type=int, nargs="+", default=[2, 3])
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--docs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=256, help="tokens per calibration document")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sums-device", default=None, help="passed to rf-eval fit (default: its own default)")
    p.add_argument("--heldout-memory", default=None,
                   help="fit with --heldout (9 lambdas) and this --heldout-memory (GiB or auto); default: no held-out")
    p.add_argument("--child-pythonpath", default=None,
                   help="PYTHONPATH of the children (e.g. another checkout, for a before/after comparison)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if args.child_pythonpath:
        env["PYTHONPATH"] = args.child_pythonpath
    rows = []
    for d in args.hidden:
        row = measure(d, args, env)
        rows.append(row)
        print(f"d={d} L={args.layers} splits={args.splits} {args.dtype} on {args.device}: "
              f"baseline RSS {gib(row['baseline_rss'])}, fit RSS {gib(row['fit_rss'])}, "
              f"fit's own {gib(row['fit_own_rss'])} vs predicted {gib(row['predicted_fit_own'])} "
              f"(fp64 sums {gib(row['sums_bytes'])})", flush=True)
        if "fit_cuda" in row:
            print(f"  CUDA max allocated: baseline {gib(row['baseline_cuda'])}, fit {gib(row['fit_cuda'])}, "
                  f"fit's own {gib(row['fit_own_cuda'])}", flush=True)
    print("extrapolated with fit_peak_bytes, one split (lambda grid of 1; of 9 with --heldout, scored 1 per "
          "held-out pass or all in one). The fit keeps layer S's sums with or without map_split, so its memory "
          "is the same either way:")
    for name, d, n_layers, split in REAL_MODELS:
        one = fit_peak_bytes(d, n_layers, [split])
        by_one, all_nine = (fit_peak_bytes(d, n_layers, [split], n_lambdas=9, group=g) for g in (1, 9))
        print(f"  {name} d={d} L={n_layers} S={split}: fp64 sums {gib(sums_bytes(d, n_layers, [split]))}, "
              f"fit peak beside the model {gib(one)} (9 lambdas: {gib(by_one)} 1 per pass, {gib(all_nine)} "
              "in one pass)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
