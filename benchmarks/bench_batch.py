"""Batched filled prefill: requests per second of a filled arm and of `hf` at lm-eval batch sizes 1 and 8.

One process, one random-weight Llama (hidden 256, 8 layers by default), loglikelihood requests over
--prompts prompts of one token length (--tokens), one continuation each, so a batch of 8 shares one
engine call (`rf_eval.engine.batch`: padding-free, prompts of one length go together). The arms are
`hf` and `ridgefill fill=identity` (tail --tail, split L/2), each at every batch size, timed round-robin
(the order rotated each round) after one warm-up each; figures are medians over --repeats rounds.
It also checks that the filled arm's answers at every batch size equal its batch-1 answers, bitwise.

    python benchmarks/bench_batch.py [--tokens 1024] [--prompts 16] [--batch-sizes 1,8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def contexts(count: int, tokens: int, seed: int = 0) -> list[str]:
    """`count` texts of `tokens` ASCII bytes each: as many tokens under the byte-level test tokenizer."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase + "    "
    return ["".join(rng.choice(letters) for _ in range(tokens)) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--tail", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)

    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from rf_eval.testing import make_tiny_model

    shape = dict(hidden_size=a.hidden, intermediate_size=3 * a.hidden, num_hidden_layers=a.layers,
                 num_attention_heads=a.hidden // 64, num_key_value_heads=max(a.hidden // 128, 1), head_dim=64,
                 max_position_embeddings=max(8192, 2 * a.tokens))
    path = make_tiny_model("llama", Path(tempfile.mkdtemp(prefix="bench_batch_")) / "model", **shape)
    requests = [Instance("loglikelihood", {}, (c, " ab"), 0) for c in contexts(a.prompts, a.tokens)]
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    base = f"pretrained={path},dtype=float32"
    lms = {}
    for b in sizes:
        extra = {"batch_size": b, "device": a.device}
        lms[f"hf b{b}"] = get_model("hf").create_from_arg_string(base, extra)
        lms[f"filled b{b}"] = get_model("ridgefill").create_from_arg_string(f"{base},fill=identity,tail={a.tail}",
                                                                             extra)
    answers = {name: lm.loglikelihood(requests, disable_tqdm=True) for name, lm in lms.items()}  # the warm-up
    equal = all(answers[f"filled b{b}"] == answers[f"filled b{sizes[0]}"] for b in sizes)
    seen: dict[str, list[float]] = {name: [] for name in lms}
    names = list(lms)
    for r in range(a.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            lms[name].loglikelihood(requests, disable_tqdm=True)
            seen[name].append(time.perf_counter() - start)
    rate = {name: len(requests) / statistics.median(ts) for name, ts in seen.items()}
    top = sizes[-1]
    figures = {
        **{f"{name} requests/s": value for name, value in rate.items()},
        f"filled requests/s, batch {top} / batch {sizes[0]}": rate[f"filled b{top}"] / rate[f"filled b{sizes[0]}"],
        f"hf requests/s, batch {top} / batch {sizes[0]}": rate[f"hf b{top}"] / rate[f"hf b{sizes[0]}"],
        f"filled / hf requests/s, batch {top}": rate[f"filled b{top}"] / rate[f"hf b{top}"],
        f"filled / hf requests/s, batch {sizes[0]}": rate[f"filled b{sizes[0]}"] / rate[f"hf b{sizes[0]}"],
        "filled answers at every batch size equal batch 1's": float(equal),
    }
    print(f"# Llama d={a.hidden} L={a.layers}, {a.prompts} prompts of {a.tokens} tokens, tail {a.tail}, "
          f"{a.device}, torch threads {torch.get_num_threads()}; medians of {a.repeats} rounds")
    for name, value in figures.items():
        print(f"{name:52s} {value:10.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"tokens": a.tokens, "prompts": a.prompts, "figures": figures}, indent=1))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
