"""Fill against drop on the embedded SmolLM2: every method at one budget, the table the README shows.

    python benchmarks/matched_budget.py                          # runs the study, prints the table
    python benchmarks/matched_budget.py --readme README.md       # also writes it into the README's block

The quick demo's model, maps, needle samples and keytoken documents (`rf_eval.demo.study`), and its budget:
ridge's MAC fraction at tail 256 and 1,024 tokens (`ridge_budget`). Arms, each set by that budget: the fills
identity, ridge and nofill (the tail spends it), FastKV's token-selective propagation (`preset=fastkv`: its
propagated rows) and GemFilter (`--model drop`: its k). Speculative Prefill needs a speculator smaller than
the target with its tokenizer; none of SmolLM2-135M's ships offline, so it runs on the tiny test pair only
(tests/drop). The subset of needles is the quick demo's (`subset_tail` 256, the same items for every arm).
The study runs through the study runner and `rf-eval report` as any study does; the README block is rendered
from the report it wrote, kept as benchmarks/demo/matched_report.json (tests/demo/test_demo.py renders it
again and compares).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "demo" / "matched_report.json"
BEGIN = "<!-- table written by `python benchmarks/matched_budget.py --readme README.md`; do not edit -->"
END = "<!-- end of `python benchmarks/matched_budget.py` table -->"
STUDY = """\
name: fill against drop at one budget
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
maps: {maps}
tasks: [niah_single_1_filled, keytoken_nll]
lengths: {lengths}
metadata: {{subset_tail: {tail}, docs: {docs}, score_tokens: {score}, key_context: {context}}}
samples: {samples}
apply_chat_template: true
seed: 0
arms:
  exact: {{args: {{fill: exact}}}}
  identity@{budget}: {{args: {{fill: identity, split: {split}, tail: {tail}, budget: {budget}, reference: exact}}}}
  ridge@{budget}: {{args: {{fill: ridge, tail: {tail}, budget: {budget}, reference: exact}}}}
  nofill@{budget}: {{args: {{fill: nofill, split: {split}, tail: {tail}, budget: {budget}, reference: exact}}}}
  fastkv@{budget}: {{args: {{preset: fastkv, budget: {budget}, reference: exact}}}}
  gemfilter@{budget}: {{model: drop, args: {{method: gemfilter, budget: {budget}, reference: exact}}}}
reference: exact
"""


def caption(budget: float) -> str:
    return (f"`python benchmarks/matched_budget.py`: SmolLM2-135M-Instruct with the quick demo's needle samples, "
            f"documents and maps (split 18 of 30), every arm set by budget {budget:g} (ridge's MAC fraction at tail "
            "256 and 1,024 tokens): identity, ridge and nofill turn their tail, FastKV (`preset=fastkv`, split 15) its "
            "propagated rows, GemFilter (`--model drop`, filter layer 12) its k. Needles counted on the quick demo's "
            "filled region (the last 256 rows excluded, for every arm).")


def keytoken_cells(report: dict, tag: str = "") -> dict[str, dict]:
    """Each arm's keytoken_nll cells (key, novel, kl, ...) in the report, of the arms named `...tag`."""
    (kt,) = [m for m in report["measures"] if m["task"] == "keytoken_nll"]
    return {r["arm"]: r["cells"] for r in kt["rows"] if r["arm"].endswith(tag)}


def best_arms(report: dict, tag: str = "") -> dict[str, str]:
    """Per measure (`needles`, `key`, `novel`, `kl`), the arms named `...tag` that do best, from the report's own
    figures: ties named together (without the tag), "every arm alike" where all tie."""
    figures = {"needles": {r["arm"]: r["arm_score"] for r in report["overall"] if r["arm"].endswith(tag)}}
    cells = keytoken_cells(report, tag)
    figures |= {name: {a: c[name]["difference"] for a, c in cells.items() if c.get(name)}
                for name in ("key", "novel", "kl")}

    def best(values: dict, low: bool) -> str:
        if len(set(values.values())) == 1:
            return "every arm alike"
        top = min(values.values()) if low else max(values.values())
        return ", ".join(a.removesuffix(tag) for a, v in values.items() if v == top)

    return {name: best(values, low=name != "needles") for name, values in figures.items()}


def winners(report: dict) -> str:
    """Which arm does best on each measure (`best_arms`)."""
    best = best_arms(report)
    return (f"At this budget: most filled-region needles: {best['needles']}; lowest key-token ΔNLL: "
            f"{best['key']}; lowest novel-token ΔNLL: {best['novel']}; lowest KL: {best['kl']}.")


def render(report: dict) -> str:
    from rf_eval.reports.render import render_demo_table

    budget = next(a["budget"] for a in report["arms"] if a.get("budget") is not None)
    return f"{caption(budget)}\n\n{render_demo_table(report)}\n{winners(report)}\n"


def run(out: Path) -> dict:
    from transformers import AutoConfig

    from rf_eval.demo.model import demo_model_dir
    from rf_eval.demo.study import SPLIT, demo_maps, keytoken_docs_dir, ridge_budget, settings
    from rf_eval.study.launch import InProcessLauncher
    from rf_eval.study.runner import run_study, write_report
    from rf_eval.study.study_file import load_study

    s = settings(quick=True)
    model_dir = demo_model_dir()
    maps = demo_maps(model_dir, s)
    docs = keytoken_docs_dir(model_dir, out, s)
    budget = ridge_budget(AutoConfig.from_pretrained(model_dir), s)
    samples = {"niah_single_1_filled": list(range(s.samples_per_length)), "keytoken_nll": list(range(s.keytoken_docs))}
    path = out / "study.yaml"
    path.write_text(STUDY.format(model=model_dir, maps=maps, lengths=json.dumps(list(s.lengths)), tail=s.tail,
                                 docs=docs, score=s.keytoken_score, context=s.keytoken_context,
                                 samples=json.dumps(samples), budget=budget, split=SPLIT))
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    study = load_study(path)
    run_study(study, out, InProcessLauncher(), report=False)
    if write_report(study, out, out / "ledger.jsonl") != 0:
        raise SystemExit("rf-eval report failed")
    return json.loads((out / "report.json").read_text())


def write_readme(readme: Path, block: str, begin: str = BEGIN, end: str = END) -> None:
    """`block` between the README's `begin` and `end` lines."""
    text = readme.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{readme} has no block for this table: add the lines\n{begin}\n{end}")
    head, rest = text.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{block.rstrip()}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the runs and the report (default: a temporary one)")
    parser.add_argument("--readme", type=Path, help="write the table into this README's block")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="matched-budget-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = run(out)
    block = render(report)
    print(block)
    if args.readme is not None:
        write_readme(args.readme, block)
        RECORD.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote the table into {args.readme} and its report into {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
