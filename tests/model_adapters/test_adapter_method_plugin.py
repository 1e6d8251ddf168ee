"""A prefill method in one file outside the package runs through `lm_eval` with no other edit (#39 item 4).

The file is the README's own ("Adding a prefill method"): a throwaway dropper whose cache holds a prompt's
last `keep` rows only, with its settings (`Arm`) and its cost. Saved into a folder named by
RF_EVAL_METHOD_PATH, it runs as `lm_eval --model prefill --model_args pretrained=...,method=keep_last,keep=8`;
a task of the test's own writes each prompt's recorded prefill cost into its samples.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from adapter_helpers import GEN_TASK, GEN_YAML, TASK_YAML, cli_env, run_lm_eval
from warm_start import run_argv

ROOT = Path(__file__).resolve().parents[2]


def readme_method_file() -> tuple[str, str]:
    """The README's example method module ("Adding a prefill method") and its `method=` name."""
    section = (ROOT / "README.md").read_text().split("## Adding a prefill method", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return code, re.search(r'^    name = "(\w+)"', code, re.M).group(1)


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
    record each prompt's prefill cost, its name; beside it `GEN_TASK`, generating after the same contexts."""
    folder.mkdir()
    data = folder / "data.jsonl"
    context = " ".join(["the cat sat on a mat by the river stone"] * 4)
    data.write_text("".join(json.dumps({"context": f"{context} {i}", "choices": [" red", " blue dog"], "label": i})
                            + "\n" for i in range(2)))
    yaml = TASK_YAML.format(data=data).replace("rfe_adapter_mc", "rfe_method_cost")
    (folder / "rfe_method_cost.yaml").write_text(yaml.split("metric_list:")[0] + COST_METRICS)
    (folder / "utils.py").write_text(COST_UTILS)
    (folder / f"{GEN_TASK}.yaml").write_text(GEN_YAML.format(data=data))  # and a generation task on the same docs
    return "rfe_method_cost"


def test_a_method_in_one_file_runs_through_lm_eval(tiny_model_dir, tmp_path, monkeypatch):
    methods = tmp_path / "methods"
    methods.mkdir()
    code, name = readme_method_file()
    (methods / f"{name}.py").write_text(code)
    task = cost_task(tmp_path / "task")
    model = tiny_model_dir("llama")
    argv = ["--model", "prefill", "--model_args", f"pretrained={model},method={name},keep=8", "--tasks", f"{task},{GEN_TASK}",
            "--include_path", str(tmp_path / "task"), "--limit", "2", "--device", "cpu", "--log_samples",
            "--output_path", str(tmp_path / "out")]
    monkeypatch.setenv("RF_EVAL_METHOD_PATH", str(methods))
    listed = run_argv([sys.executable, "-m", "rf_eval", "methods"], env=cli_env(), timeout=120)
    assert listed.returncode == 0 and f"| `{name}` | `--model prefill` `method={name}` | - | keep |" in listed.stdout
    proc = run_lm_eval(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    arm = results["config"]["rf_eval"]
    assert (arm["method"], arm["keep"], arm["model_type"]) == (name, 8, "llama")
    assert len(arm["weights_sha256"]) == 64
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob(f"samples_{task}_*.jsonl")).read_text()
               .splitlines()]
    assert len(samples) == 2
    generated = [json.loads(line) for line in next((tmp_path / "out").rglob(f"samples_{GEN_TASK}_*.jsonl"))
                 .read_text().splitlines()]
    assert len(generated) == 2 and all(isinstance(g["resps"][0][0], str) for g in generated)
    for sample in samples:  # the method's own cost model: 8 of the prompt's rows prefilled
        assert sample["prompt_tokens"] > 8 and 0 < sample["macs_fraction"] < 1
        assert sample["macs_fraction"] < 2 * 8 / sample["prompt_tokens"]
