"""Run lm-eval for real, offline, to make the output folders the report tests read.

Usage: python lmeval_runner.py OUT_DIR

Writes two small tasks of our own under OUT_DIR/tasks (a local JSON dataset
each, no download): `rfe_mc`, multiple choice scored by log-likelihood, and
`rfe_ruler`, a generation task scored by lm-eval's own RULER scorer, so its
samples carry RULER's per-length metrics. Then runs lm-eval's `dummy` model as
two arms (model_args arm=exact and arm=ridge, different seeds, so the
log-likelihoods differ) with --log_samples into OUT_DIR/exact and
OUT_DIR/ridge. The evaluation and the writing of results and samples are
lm-eval's (simple_evaluate and EvaluationTracker, called as its CLI calls
them); running both arms in one process only saves the start-up and task
indexing that each `lm_eval` command would repeat.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

LENGTHS = (256, 512, 1024)

MC_YAML = """task: rfe_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

RULER_YAML = """task: rfe_ruler
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{input}}}}"
doc_to_target: "{{{{outputs}}}}"
target_delimiter: " "
process_results: !function rfe_utils.process_results
metric_list:
{metrics}generation_kwargs:
  do_sample: false
  max_gen_toks: 8
  until: []
metadata:
  version: 1.0
"""


def write_tasks(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "mc.jsonl", "w") as fh:
        for i in range(24):
            choices = [str(i + k) for k in (1, 2, 0, 3)]
            doc = {"question": f"What is {i} plus one?", "choices": choices, "answer": 0}
            doc["max_length"] = LENGTHS[i % 3]
            fh.write(json.dumps(doc) + "\n")
    with open(folder / "ruler.jsonl", "w") as fh:
        for i in range(12):
            answer = "lol" if i % 3 else str(7000 + i)  # the dummy model always answers "lol"
            doc = {"index": i, "input": f"The magic number is {answer}. What is the magic number?",
                   "outputs": [answer], "length": 40 + i, "max_length": LENGTHS[i % 3], "gen_prefix": ""}
            fh.write(json.dumps(doc) + "\n")
    (folder / "rfe_mc.yaml").write_text(MC_YAML.format(data=folder / "mc.jsonl"))
    metrics = "".join(
        f'  - metric: "{n}"\n    aggregation: !function rfe_utils.aggregate_metrics\n    higher_is_better: true\n'
        for n in (*LENGTHS, 4096)
    )
    (folder / "rfe_ruler.yaml").write_text(RULER_YAML.format(data=folder / "ruler.jsonl", metrics=metrics))
    (folder / "rfe_utils.py").write_text(
        "from lm_eval.tasks.ruler.common_utils import aggregate_metrics, process_results  # noqa: F401\n"
    )


def main(out: Path) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    write_tasks(out / "tasks")
    manager = TaskManager(include_path=str(out / "tasks"), include_defaults=False)
    for arm, seed in (("exact", 1), ("ridge", 2)):
        tracker = EvaluationTracker(output_path=str(out / arm))
        results = simple_evaluate(
            model="dummy",
            model_args=f"arm={arm}",
            tasks=["rfe_mc", "rfe_ruler"],
            task_manager=manager,
            log_samples=True,
            evaluation_tracker=tracker,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
