"""`rf-eval demo`'s run: the demo's study (`rf_eval.demo.study`) end to end, in this process.

1. The demo model, converted once and cached (`rf_eval.demo.model`).
2. Its maps, fitted on the standard library's docstrings and cached (`rf_eval.demo.study.demo_maps`).
3. The built-in study file rendered with this run's paths and sizes, run by the study runner: each arm a
   plain `lm_eval` command, the same code path a user runs, here all in this one process
   (`InProcessLauncher`, which saves each arm's start and imports; the exact arm first, whose key tokens
   the others share, and whose stock-model rows the `reference=exact` arms read back: `rf_eval.engine.shared_rows`;
   the first filled arm's lower layers, which the next arms of its split read back:
   `rf_eval.engine.shared_lower`).
4. The report over the runs (`rf_eval.study.runner.write_report`): paired intervals against exact, as HTML,
   and the demo's table.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from transformers import AutoConfig

from rf_eval.demo.model import demo_model_dir
from rf_eval.demo.study import (
    SPLIT,
    caption,
    demo_maps,
    keytoken_docs_dir,
    render_study,
    ridge_budget,
    settings,
)
from rf_eval.demo.table import readme_block, replace_block, write_table
from rf_eval.study.launch import InProcessLauncher, environ_set
from rf_eval.study.runner import run_study, write_report
from rf_eval.study.study_file import load_study

__all__ = ["run_demo"]


def run_demo(out: Path, quick: bool = False, readme: Path | None = None) -> Path:
    """Run the whole demo; returns the report's path. `readme`: also rewrite that file's demo table block
    for this size (`rf_eval.demo.table`), checked before anything runs."""
    if readme is not None and readme_block(readme.read_text(encoding="utf-8"), quick) is None:
        replace_block(readme, "", quick)  # raises, naming the markers to add
    t0 = time.perf_counter()
    s = settings(quick)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    print("[1/4] demo model (converted once, then cached)", flush=True)
    model_dir = demo_model_dir()
    print(f"      {model_dir}")
    print(f"[2/4] maps for split {SPLIT} (fitted once on the standard library's docstrings, then cached)",
          flush=True)
    maps = demo_maps(model_dir, s)
    print(f"      {maps}")
    docs = keytoken_docs_dir(model_dir, out, s)
    budget = ridge_budget(AutoConfig.from_pretrained(model_dir), s)
    study = load_study(render_study(out, s, model_dir, maps, docs, budget))
    study = dataclasses.replace(study, arms_folder="runs")
    print(f"[3/4] arms {', '.join(study.arms)} through lm_eval on {', '.join(study.tasks)} (study {study.path})",
          flush=True)
    with environ_set({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}):
        run_study(study, out, InProcessLauncher(), report=False)
    print("[4/4] report", flush=True)
    html = out / "report.html"
    if write_report(study, out, out / "ledger.jsonl") != 0:
        raise RuntimeError("rf-eval report failed")
    table = write_table(out, caption(s, quick))
    print(f"\n{table}")
    if readme is not None:
        replace_block(readme, table, quick, report=out / "report.json")
        print(f"wrote the table into {readme}")
    print(f"done in {time.perf_counter() - t0:.0f}s; report: {html}")
    return html
