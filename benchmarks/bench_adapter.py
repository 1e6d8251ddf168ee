"""Adapter throughput: `ridgefill fill=exact` against lm-eval's `hf` on the same loglikelihood requests.

One process, one model, one batch size per row: the requests come from a
multiple-choice task over a local JSONL file (3 choices of 1-4 words per
context, built by lm-eval's own task code), and each model's `loglikelihood`
runs on all of them. Figures are requests per second, the median of --repeats
timed runs after one warm-up, the two models alternating. Target: ratio
(ridgefill / hf) >= 1.0. A filled arm (identity fill, short tail) is timed
too, for information: it runs the engine's prefill and the cache extension.

    python benchmarks/bench_adapter.py [--pretrained DIR] [--batch-sizes 1,8] [--words 30,200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "model_adapters"))


def requests_for(task_dir: Path) -> list:
    """The loglikelihood Instances lm-eval builds for the task (tokenizer-free: plain text)."""
    from adapter_helpers import TASK
    from lm_eval.tasks import TaskManager

    task = TaskManager(include_path=str(task_dir), include_defaults=False).load([TASK])["tasks"][TASK]
    task.build_all_requests(rank=0, world_size=1)
    return list(task.instances)


def timed(lm, requests: list, repeats: int) -> float:
    lm.loglikelihood(requests[: max(3, len(requests) // 10)], disable_tqdm=True)  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        lm.loglikelihood(requests, disable_tqdm=True)
        runs.append(time.perf_counter() - start)
    return len(requests) / statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", help="model folder (default: a tiny random Llama built here)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--words", default="30,200", help="context lengths in words (one row each)")
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: tiny models only contend)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    import torch
    from adapter_helpers import write_task
    from lm_eval.api.registry import get_model

    from rf_eval.testing import make_tiny_model

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_adapter_"))
    model = args.pretrained or str(make_tiny_model("llama", tmp / "tiny_llama"))
    base = f"pretrained={model},dtype={args.dtype}"
    print(f"model {model}  device {args.device}  torch {torch.__version__}  {platform.processor() or platform.machine()}")
    print(f"{'ctx words':>9} {'batch':>5} {'requests':>8} {'hf req/s':>9} {'ridgefill req/s':>15} {'ratio':>6}"
          f" {'filled req/s':>12}")
    rows = []
    for words in (int(w) for w in args.words.split(",")):
        requests = requests_for(write_task(tmp / f"task{words}", args.docs, context_words=(words, words + words // 4)))
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            extra = {"batch_size": batch, "device": args.device}
            hf = get_model("hf").create_from_arg_string(base, extra)
            rf = get_model("ridgefill").create_from_arg_string(f"{base},fill=exact", extra)
            filled = get_model("ridgefill").create_from_arg_string(f"{base},fill=identity,tail=16", extra)
            rates: dict[str, list[float]] = {"hf": [], "rf": [], "filled": []}
            for _ in range(2):  # alternate, so drift in machine load hits both
                rates["hf"].append(timed(hf, requests, args.repeats))
                rates["rf"].append(timed(rf, requests, args.repeats))
            rates["filled"].append(timed(filled, requests, args.repeats))
            row = {k: statistics.median(v) for k, v in rates.items()}
            row.update(words=words, batch=batch, requests=len(requests), ratio=row["rf"] / row["hf"])
            rows.append(row)
            print(f"{words:>9} {batch:>5} {len(requests):>8} {row['hf']:>9.1f} {row['rf']:>15.1f} "
                  f"{row['ratio']:>6.2f} {row['filled']:>12.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
