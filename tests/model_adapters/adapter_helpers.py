"""Helpers for the adapter tests: a local loglikelihood task, the real `lm_eval` CLI in a subprocess, maps."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from warm_start import run_argv

from rf_eval.model_adapters import prefill_lm

LM_EVAL = str(Path(sys.executable).parent / "lm_eval")


def lm(model_dir: str, **args) -> prefill_lm.ridgefill:
    """The `ridgefill` adapter on the CPU, in process, as lm-eval builds it from `--model_args`."""
    return prefill_lm.ridgefill.create_from_arg_obj({"pretrained": model_dir, "device": "cpu", **args})

TASK_YAML = """task: rfe_adapter_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
GEN_YAML = """task: rfe_adapter_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{choices[0]}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
TASK = "rfe_adapter_mc"
GEN_TASK = "rfe_adapter_gen"
WORDS = "the cat dog sat on a mat red blue green house tree river stone light dark quick slow".split()


def write_task(folder: Path, n_docs: int = 8, seed: int = 0, context_words: tuple[int, int] = (10, 40)) -> Path:
    """Two tasks over one local JSONL file: multiple choice (1- to 4-word choices) and generation."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.jsonl"
    with data.open("w") as f:
        for i in range(n_docs):
            context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*context_words)))
            choices = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(3)]
            f.write(json.dumps({"context": context, "choices": choices, "label": i % 3}) + "\n")
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(data=data))
    (folder / f"{GEN_TASK}.yaml").write_text(GEN_YAML.format(data=data))
    return folder


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",  # tiny models: threads only contend
    )
    return env


def run_lm_eval(args: list[str], cwd: Path, command: list[str] | None = None) -> subprocess.CompletedProcess:
    """The plain `lm_eval` command (or `command`) with `args`; output captured."""
    return run_argv([*(command or [LM_EVAL]), *args], cwd=cwd, env=cli_env(), timeout=600)


def samples(out_dir: Path, task: str) -> dict[tuple[int, int], dict]:
    """The --log_samples records of `task`, keyed by (doc_id, request index)."""
    files = sorted(glob.glob(f"{out_dir}/**/samples_{task}_*.jsonl", recursive=True))
    assert files, f"no samples for {task} under {out_dir}"
    out = {}
    for line in Path(files[-1]).read_text().splitlines():
        rec = json.loads(line)
        for index, resp in enumerate(rec["resps"]):
            out[(rec["doc_id"], index)] = {"resp": resp[0], "rec": rec}
    return out


def loglikelihoods(out_dir: Path, task: str = TASK) -> dict[tuple[int, int], tuple[float, bool]]:
    return {k: (float(v["resp"][0]), v["resp"][1] == "True") for k, v in samples(out_dir, task).items()}


def identity_maps(model_dir: str, split: int, out_dir: Path) -> Path:
    """A map file with A = I and b = 0 for every late layer: fill=ridge then equals fill=identity."""
    import torch
    from transformers import AutoConfig

    from rf_eval.ridge.maps import RidgeMaps, config_hash

    config = AutoConfig.from_pretrained(model_dir)
    d = config.hidden_size
    layers = range(split, config.num_hidden_layers)
    maps = RidgeMaps(
        split=split,
        A={layer: torch.eye(d) for layer in layers},
        b={layer: torch.zeros(d) for layer in layers},
        metadata={"config_hash": config_hash(config), "lambda": "0.01", "rows": "123"},
    )
    return maps.save(out_dir)
