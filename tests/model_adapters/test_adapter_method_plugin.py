"""A prefill method in one file outside the package runs through `lm_eval` with no other edit (#39 item 4).

The file below is the whole method: a throwaway dropper whose cache holds a prompt's last `keep` rows
only, with its settings (`Arm`) and its cost. Saved into a folder named by RF_EVAL_METHOD_PATH, it runs as
`lm_eval --model prefill --model_args pretrained=...,method=keep_last,keep=4`; a task of the test's own
writes each prompt's recorded prefill cost into its samples.
"""

from __future__ import annotations

import json
from pathlib import Path

from adapter_helpers import TASK_YAML, run_lm_eval

METHOD_FILE = '''
"""keep_last: the cache holds a prompt's last `keep` rows, at their own positions (a throwaway dropper)."""

from dataclasses import dataclass

import torch

from rf_eval.drop.result import DroppedResult
from rf_eval.engine import new_cache, plain_prefill
from rf_eval.methods import Method
from rf_eval.prefill_cost import PrefillCost
from rf_eval.mac_model import cache_rows, prefill_macs


class KeepLast(Method):
    name = "keep_last"

    @dataclass(frozen=True)
    class Arm:
        keep: int = 8

    def is_plain(self, n):
        return n <= self.spec.keep

    @torch.no_grad()
    def prefill(self, input_ids, *, for_generation=False, held_back=0):
        ids = input_ids.to(self.device)[:, : input_ids.shape[1] - int(for_generation)]
        n = ids.shape[1]
        if self.is_plain(n):
            return plain_prefill(self.model, ids)
        kept = torch.arange(n - self.spec.keep, n, device=ids.device)
        cache = new_cache(self.model)
        out = self.model(input_ids=ids[:, kept], cache=cache, use_cache=True, position_ids=kept[None],
                         logits_to_keep=1)
        return DroppedResult(cache=cache, logits=out.logits[:, -1], exact_rows=kept, prompt_length=n,
                             kept=kept, positions=kept, prompt_rows=n)

    def prefill_cost(self, n, result=None):
        config, k = self.model.config, min(self.spec.keep, n)
        return PrefillCost(n, prefill_macs(config, k), prefill_macs(config, n), k, cache_rows(config, k),
                           cache_rows(config, n))
'''

#: a local task whose samples carry each prompt's prefill cost (`rf_eval.tasks.common.cost_fields`)
COST_UTILS = '''
from rf_eval.tasks.common import cost_fields


def process_results(doc, results):
    lls = [ll for ll, _ in results]
    cost = cost_fields(doc["context"])
    return {"acc": float(lls.index(max(lls)) == doc["label"]), "macs_fraction": cost["macs_fraction"],
            "prompt_tokens": cost["prompt_tokens"]}
'''
COST_METRICS = """process_results: !function utils.process_results
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: macs_fraction
    aggregation: mean
    higher_is_better: false
  - metric: prompt_tokens
    aggregation: mean
    higher_is_better: false
"""


def cost_task(folder: Path) -> str:
    """A two-document multiple-choice task (long enough contexts that the method drops rows) whose samples
    record each prompt's prefill cost; its name."""
    folder.mkdir()
    data = folder / "data.jsonl"
    context = " ".join(["the cat sat on a mat by the river stone"] * 4)
    data.write_text("".join(json.dumps({"context": f"{context} {i}", "choices": [" red", " blue dog"], "label": i})
                            + "\n" for i in range(2)))
    yaml = TASK_YAML.format(data=data).replace("rfe_adapter_mc", "rfe_method_cost")
    (folder / "rfe_method_cost.yaml").write_text(yaml.split("metric_list:")[0] + COST_METRICS)
    (folder / "utils.py").write_text(COST_UTILS)
    return "rfe_method_cost"


def test_a_method_in_one_file_runs_through_lm_eval(tiny_model_dir, tmp_path, monkeypatch):
    methods = tmp_path / "methods"
    methods.mkdir()
    (methods / "keep_last.py").write_text(METHOD_FILE)
    task = cost_task(tmp_path / "task")
    model = tiny_model_dir("llama")
    argv = ["--model", "prefill", "--model_args", f"pretrained={model},method=keep_last,keep=8", "--tasks", task,
            "--include_path", str(tmp_path / "task"), "--limit", "2", "--device", "cpu", "--log_samples",
            "--output_path", str(tmp_path / "out")]
    monkeypatch.setenv("RF_EVAL_METHOD_PATH", str(methods))
    proc = run_lm_eval(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    arm = results["config"]["rf_eval"]
    assert (arm["method"], arm["keep"], arm["model_type"]) == ("keep_last", 8, "llama")
    assert len(arm["weights_sha256"]) == 64
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 2
    for sample in samples:  # the method's own cost model: 8 of the prompt's rows prefilled
        assert sample["prompt_tokens"] > 8 and 0 < sample["macs_fraction"] < 1
        assert sample["macs_fraction"] < 2 * 8 / sample["prompt_tokens"]
