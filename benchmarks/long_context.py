"""Fills, drops and sparse attention where attention dominates: every family at two budgets, at 2K-8K tokens.

    python benchmarks/long_context.py                          # the three studies, then the tables
    python benchmarks/long_context.py --lengths 2048           # one length
    python benchmarks/long_context.py --readme README.md       # also writes the tables into the README's block

Issue #56 item 7. One study per length on the embedded SmolLM2-135M-Instruct (its 8,192 positions), through
the study runner and `rf-eval report` as any study (each report has its own frontier chart): exact; the
fills identity, ridge and nofill (their tail set by the budget; the quick demo's maps, split 18); FastKV
(`preset=fastkv`) and GemFilter (`--model drop`); FlexPrefill, XAttention and the fixed sink-and-window
pattern (`--model prefill` with `method=flexprefill` ...: their blocks capped by the budget); and ridge with
FlexPrefill in every exact layer (`fill=ridge,sparse=flexprefill`). Each length's lower budget sits just above
the sparse methods' floor at its shortest prompt (a sparse arm cuts only attention, a growing share of the
MACs as prompts grow; each method's budget knob gives the floor), the other one above it.

Measures: needles of `niah_single_1_filled` on the filled region (the last 256 rows excluded, as the
quick demo's), and `keytoken_nll` on the corpus's report documents read as their first N - 256 tokens with the
last 256 scored (key tokens: those whose exact loss rises by 2 nats when the context is cut to 256 tokens):
key-token and novel-token dNLL and KL(exact||arm), paired with exact by document. The report documents are few
at these lengths, so the intervals are wide; the tables say how many, and how long each length's arms ran
(about an hour in all on 2 cores). `paired_timing: false`: the runs measure quality; the speed benchmark is
`benchmarks/bench_methods.py`.

Each length's report is kept as benchmarks/demo/long_context_<N>.json; tests/demo/test_long_context.py renders the
README block from them again and compares. A killed run resumes (the study runner skips finished arms) when given
the same `--out`; a changed study (other sizes or budgets) needs a new one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from matched_budget import best_arms, keytoken_cells, write_readme  # noqa: E402

RECORDS = ROOT / "benchmarks" / "demo"
BEGIN = "<!-- tables written by `python benchmarks/long_context.py --readme README.md`; do not edit -->"
END = "<!-- end of `python benchmarks/long_context.py` tables -->"
#: per length: the two budgets, the needle samples and the report documents
SIZES = {2048: ((0.85, 0.9), 6, 6), 4096: ((0.7, 0.85), 4, 4), 8192: ((0.65, 0.8), 2, 2)}
SCORED = 256  # keytoken's scored tokens, its key-token cut and the needles' excluded tail
STUDY = """\
name: every family at {length} tokens
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
maps: {maps}
tasks: [niah_single_1_filled, keytoken_nll]
lengths: [{length}]
metadata: {{subset_tail: {scored}, docs: {docs}, score_tokens: {scored}, key_context: {scored}, lengths: [{context}]}}
samples: {samples}
apply_chat_template: true
seed: 0
budgets: {budgets}
arms:
  exact: {{args: {{fill: exact}}}}
  identity: {{args: {{fill: identity, split: {split}, tail: {scored}, {reference}}}}}
  ridge: {{args: {{fill: ridge, tail: {scored}, {reference}}}}}
  nofill: {{args: {{fill: nofill, split: {split}, tail: {scored}, {reference}}}}}
  fastkv: {{args: {{preset: fastkv, {reference}}}}}
  gemfilter: {{model: drop, args: {{method: gemfilter, {reference}}}}}
  flexprefill: {{model: prefill, args: {{method: flexprefill, {reference}}}}}
  xattention: {{model: prefill, args: {{method: xattention, {reference}}}}}
  sinkwindow: {{model: prefill, args: {{method: sinkwindow, {reference}}}}}
  ridge+flexprefill: {{args: {{fill: ridge, tail: {scored}, sparse: flexprefill, {reference}}}}}
reference: exact
"""


def report_docs(model_dir: Path, out: Path, length: int, count: int) -> Path:
    """The corpus's report documents of at least `length` tokens (each read as its first `length`)."""
    from transformers import AutoTokenizer

    from rf_eval.demo.corpus import write_demo_corpus

    folder = out / f"docs_{length}"
    if not (folder / "evaluation.jsonl").is_file():
        write_demo_corpus(folder, 0, 0, AutoTokenizer.from_pretrained(model_dir), n_evaluation=count,
                          min_tokens=length, max_tokens=length + length // 4)
    return folder


def run_length(out: Path, length: int) -> dict:
    from rf_eval.demo.model import demo_model_dir
    from rf_eval.demo.study import SPLIT, demo_maps, settings
    from rf_eval.study.launch import InProcessLauncher
    from rf_eval.study.runner import run_study, write_report
    from rf_eval.study.study_file import load_study

    budgets, needles, docs = SIZES[length]
    model_dir = demo_model_dir()
    folder = out / str(length)
    folder.mkdir(parents=True, exist_ok=True)
    samples = {"niah_single_1_filled": list(range(needles)), "keytoken_nll": list(range(docs))}
    path = folder / "study.yaml"
    path.write_text(STUDY.format(length=length, model=model_dir, maps=demo_maps(model_dir, settings(quick=True)),
                                 docs=report_docs(model_dir, out, length, docs), scored=SCORED,
                                 context=length - SCORED, samples=json.dumps(samples), budgets=list(budgets),
                                 split=SPLIT, reference="reference: exact, paired_timing: false"))
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    study = load_study(path)
    run_study(study, folder, InProcessLauncher(), report=False)
    if write_report(study, folder, folder / "ledger.jsonl") != 0:
        raise SystemExit(f"rf-eval report failed for {length} tokens")
    report = json.loads((folder / "report.json").read_text())
    arms = json.loads((folder / "study.json").read_text())["arms"].values()
    report["run"] = {"arm_seconds": round(sum(a.get("seconds") or 0 for a in arms)), "cpu_cores": os.cpu_count()}
    return report


def winners(report: dict, budget: float) -> str:
    """Per measure, the arms of one budget that do best (`best_arms`)."""
    best = best_arms(report, f"@{budget:g}")
    return (f"budget {budget:g}: most needles {best['needles']}; lowest key-token ΔNLL {best['key']}; "
            f"lowest novel-token ΔNLL {best['novel']}; lowest KL {best['kl']}")


def frontier(report: dict) -> str:
    """Per frontier measure, the arms its report places on the quality-cost Pareto frontier (realised MACs)."""
    out = []
    for measure in report["frontier"]["measures"]:
        key = measure["key"]
        arms = [a["arm"] for a in report["frontier"]["arms"]
                if any(c["measures"].get(key, {}).get("pareto") for c in a["lengths"])]
        out.append(f"{measure['label']} against realised MACs: {', '.join(arms) or 'none'}")
    return "On the frontier (the report's chart): " + "; ".join(out) + "."


def render(reports: dict[int, dict]) -> str:
    from rf_eval.reports.render import render_demo_table

    parts = []
    for length, report in sorted(reports.items()):
        budgets, needles, docs = SIZES[length]
        with_key = max((c.get("key") or {}).get("n", 0) for c in keytoken_cells(report).values())
        run = report.get("run") or {}
        took = (f"; its arms ran {run['arm_seconds'] / 60:.0f} min on {run['cpu_cores']} CPU cores"
                if run.get("arm_seconds") else "")
        parts.append(f"**{length:,} tokens** ({needles} needle prompts, {docs} report documents of "
                     f"{length - SCORED:,} context tokens and {SCORED} scored, {with_key} of them with key tokens; budgets "
                     f"{' and '.join(f'{b:g}' for b in budgets)}{took}):\n\n{render_demo_table(report)}\n"
                     + "; ".join(winners(report, b) for b in budgets) + ". " + frontier(report) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the runs and reports (default: a temporary one)")
    parser.add_argument("--lengths", type=int, nargs="+", default=sorted(SIZES), choices=sorted(SIZES),
                        help="prompt lengths to run (default: all)")
    parser.add_argument("--readme", type=Path, help="write the tables into this README's block")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="long-context-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    reports = {n: run_length(out, n) for n in args.lengths}
    for n, report in reports.items():
        (RECORDS / f"long_context_{n}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    stored = {n: json.loads(p.read_text()) for n in SIZES if (p := RECORDS / f"long_context_{n}.json").is_file()}
    block = render(stored)
    print(block)
    if args.readme is not None:
        write_readme(args.readme, block, BEGIN, END)
        print(f"wrote the tables into {args.readme}; the reports are in {RECORDS}/long_context_<N>.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
