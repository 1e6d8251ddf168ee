"""Choose the demo's maps by measurement: calibration size, chat copies, the lambda grid, map_split, split.

For each candidate, maps are fitted on the demo corpus (`rf_eval.demo.corpus`: standard-library
docstrings) for the demo split, and the demo model's arms are measured in process
(`rf_eval.demo.quality`) at the quick and the full demo's sizes: key-token and novel-token ΔNLL and
KL(exact || arm) on the corpus's development documents (its `heldout` set: never fitted on), and
filled-region needles of lm-eval's niah_single_1 from the development samples (after the first
`quality.REPORT_NEEDLES` of each length). Nothing here reads the report data (the corpus's `evaluation`
set, the first needles) that the demo's tables and the quality tests measure on: the settings are chosen
out of sample. identity and nofill are measured once.

    python benchmarks/demo_sweep.py --out sweep.json            # every candidate, both sizes
    python benchmarks/demo_sweep.py --candidates c24-chat-grid --needles 8
    python benchmarks/demo_sweep.py --candidates demo --fills ridge kv_ridge   # fills side by side

Prints one Markdown table per size; the closing notes of the demo's settings quote it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rf_eval.ridge.sums import LAMBDA_GRID


@dataclass(frozen=True)
class Candidate:
    name: str
    calibration_docs: int
    chat_copies: bool
    lambdas: tuple[float, ...]  # one value: fixed; several: chosen on held-out text


GRID = LAMBDA_GRID
CANDIDATES = {c.name: c for c in (
    Candidate("c3-0.03", 3, False, (0.03,)),  # the quick demo's maps before the sweep
    Candidate("c6-grid3", 6, False, (0.01, 0.03, 0.1)),  # the full demo's maps before the sweep
    Candidate("c6-grid", 6, False, GRID),
    Candidate("c12-grid", 12, False, GRID),
    Candidate("c24-grid", 24, False, GRID),
    Candidate("c12-chat-grid", 12, True, GRID),  # + chat-formatted copies (the paper's Flash-Next maps)
    Candidate("c24-chat-grid", 24, True, GRID),
    Candidate("c48-grid", 48, False, GRID),
    Candidate("demo", 48, False, GRID),  # the demo's maps as `rf_eval.demo.study.settings` makes them
)}


def demo_size(quick: bool) -> tuple:
    """A demo size's (lengths, tail, evaluation documents, their tokens (min, max), scored tokens, key
    context), from the demo's own settings."""
    from rf_eval.demo.study import settings

    s = settings(quick)
    return (s.lengths, s.tail, s.keytoken_docs, s.keytoken_tokens, s.keytoken_score, s.keytoken_context)


SIZES = {
    "quick-before": ((1024,), 256, 2, (1000, 1400), 128, 256),  # the quick demo's sizes before the sweep
    "full-before": ((1024, 2048), 512, 2, (1000, 1400), 256, 512),  # the full demo's before the sweep
    "quick": demo_size(quick=True),
    "full": demo_size(quick=False),
}


def fit(model, tokenizer, candidate: Candidate, folder: Path, split: int, fill: str = "ridge") -> Path:
    from rf_eval.demo.study import SPLIT, fit_demo_maps, settings

    if candidate.name == "demo" and fill == "ridge" and split == SPLIT:  # the demo's own maps, cached
        from rf_eval.demo.model import demo_model_dir
        from rf_eval.demo.study import demo_maps

        return demo_maps(demo_model_dir(), settings(quick=True), progress=False)

    out = folder / (candidate.name if fill == "ridge" else f"{candidate.name}-{fill}")
    if split != SPLIT:
        out = out.with_name(f"{out.name}-s{split}")
    if not (out / f"ridgefill_split{split}.safetensors").is_file():
        t0 = time.perf_counter()
        sizes = replace(settings(quick=True), calibration_docs=candidate.calibration_docs, heldout_docs=4,
                        chat_copies=candidate.chat_copies, lambdas=candidate.lambdas)
        fit_demo_maps(model, tokenizer, out, sizes, split=split, progress=False, fill=fill)
        print(f"  fitted {candidate.name} ({fill}) in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return out


def development_documents(tokenizer, folder: Path, n_docs: int, lo: int, hi: int) -> list[str]:
    """The sweep's documents: the corpus's development set (`rf_eval.demo.corpus.DEVELOPMENT`) at a demo
    size, never the report set the demo's tables read."""
    from rf_eval.demo.corpus import DEVELOPMENT, write_demo_corpus

    write_demo_corpus(folder, 0, n_docs, tokenizer, min_tokens=lo, max_tokens=hi)
    return [json.loads(line)["text"] for line in (folder / f"{DEVELOPMENT}.jsonl").read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--needles", type=int, default=6, help="filled needle samples per length")
    p.add_argument("--maps-dir", type=Path, default=Path("/tmp/rf-eval-demo-sweep"))
    p.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    p.add_argument("--map-split", action="store_true", help="also measure each candidate with map_split=true")
    p.add_argument("--split", type=int, default=None, help="the split to fit and measure at (default the demo's)")
    p.add_argument("--fills", nargs="+", default=["ridge"], metavar="FILL",
                   help="fills with maps to fit and measure per candidate (default ridge; e.g. kv_ridge)")
    args = p.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.demo import quality
    from rf_eval.demo.model import demo_model_dir
    from rf_eval.demo.study import SPLIT
    from rf_eval.ridgefill.method import RidgeFill

    model_dir = demo_model_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    split = SPLIT if args.split is None else args.split
    maps = {(fill, name): fit(model, tok, CANDIDATES[name], args.maps_dir, split, fill)
            for name in args.candidates for fill in args.fills}
    results: dict = {}
    for size in args.sizes:
        lengths, tail, n_docs, (lo, hi), score, key_context = SIZES[size]
        docs = [tok(text, return_tensors="pt").input_ids
                for text in development_documents(tok, args.maps_dir / f"development-{size}", n_docs, lo, hi)]
        samples = quality.needle_samples(tok, str(model_dir), lengths, args.needles, tail, development=True)
        exact = RidgeFill(model, tok, fill="exact", split=split, tail=tail)
        arms = {"identity": RidgeFill(model, tok, fill="identity", split=split, tail=tail),
                "nofill": RidgeFill(model, tok, fill="nofill", split=split, tail=tail)}
        for (fill, name), path in maps.items():
            arms[f"{fill} {name}"] = RidgeFill(model, tok, fill=fill, maps=path, tail=tail)
            if args.map_split and fill == "ridge":
                arms[f"ridge {name} map_split"] = RidgeFill(model, tok, fill="ridge", maps=path, tail=tail,
                                                            map_split=True)
        t0 = time.perf_counter()
        report = quality.loss_report(arms, exact, docs, score, key_context)
        hits = {name: quality.needle_hits(arm, tok, samples) for name, arm in {"exact": exact, **arms}.items()}
        results[size] = {"loss": report.as_dict(), "needles": {k: sum(v) for k, v in hits.items()},
                         "needle_samples": len(samples), "seconds": time.perf_counter() - t0}
        print(f"\n### {size}, split {split}: lengths {list(lengths)}, tail {tail}, {len(samples)} filled needles, "
              f"{n_docs} documents ({report.n_key} key, {report.n_novel} novel tokens)\n")
        print("| arm | needles | key-token ΔNLL | novel-token ΔNLL | KL |")
        print("|---|---:|---:|---:|---:|")
        print(f"| exact | {sum(hits['exact'])}/{len(samples)} | | | |")
        for name in arms:
            print(f"| {name} | {sum(hits[name])}/{len(samples)} | {report.dnll_key[name]:+.4f} | "
                  f"{report.dnll_novel[name]:+.4f} | {report.kl[name]:.4f} |", flush=True)
        if args.map_split and ("ridge", "demo") in maps:
            print("\n" + quality.map_at_s_sentence(report, "ridge demo", "ridge demo map_split"))
    if args.out:
        args.out.write_text(json.dumps({"candidates": {n: CANDIDATES[n].__dict__ for n in args.candidates},
                                        "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main())
