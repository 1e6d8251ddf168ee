"""A prefill method in one file outside the package runs everywhere a built-in one does, with no other edit
(#53's acceptance): `lm_eval`, `rf-eval serve`, a study with `budgets:` and `rf-eval report`.

The two throwaways live in tests/methods/plugins/, found through RF_EVAL_METHOD_PATH by the processes the
tests start: `every_kth` (a dropper with its own arm field `k`, a budget's knob and its own cost) and
`source_rows` (a dropper that loads a second model beside the target, as Speculative Prefill does).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for helpers in ("model_adapters", "serving"):
    sys.path.insert(0, str(HERE.parent / helpers))

from adapter_helpers import LM_EVAL, TASK_YAML, cli_env  # noqa: E402
from serving_helpers import child_env, post, start_server, write_punkt  # noqa: E402
from warm_start import run_argv  # noqa: E402

PLUGINS = HERE / "plugins"
TASK = "rfe_throwaway_cost"
#: what the task writes of each prompt's recorded prefill cost (`rf_eval.tasks.common.cost_fields`)
COST = ("prompt_tokens", "exact_rows", "macs_fraction", "cache_fraction", "budget")
UTILS = f'''
from rf_eval.tasks.common import cost_fields


def process_results(doc, results):
    lls = [ll for ll, _ in results]
    cost = cost_fields(doc["context"])
    return {{"acc": float(lls.index(max(lls)) == doc["label"]), **{{k: cost[k] or 0.0 for k in {COST!r}}}}}
'''


def cost_task(folder: Path) -> Path:
    """A three-document multiple-choice task (contexts long enough that the methods drop rows) whose samples
    carry each prompt's prefill cost."""
    folder.mkdir(parents=True)
    data = folder / "data.jsonl"
    context = " ".join(["the river runs past the old stone house by the quiet market"] * 4)
    data.write_text("".join(json.dumps({"context": f"{context} {i}", "choices": [" red", " blue dog"],
                                        "label": i % 2}) + "\n" for i in range(3)))
    metrics = "".join(f"  - metric: {k}\n    aggregation: mean\n    higher_is_better: false\n" for k in COST)
    yaml = TASK_YAML.format(data=data).replace("rfe_adapter_mc", TASK).split("metric_list:")[0]
    (folder / f"{TASK}.yaml").write_text(yaml + "process_results: !function utils.process_results\nmetric_list:\n"
                                         "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
                                         + metrics)
    (folder / "utils.py").write_text(UTILS)
    return folder


def samples(out: Path) -> list[dict]:
    """The --log_samples records of the cost task under `out`."""
    found = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    assert found, f"no samples under {out}"
    return [json.loads(line) for line in found[-1].read_text().splitlines()]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The commands' environment: the plug-in folder on RF_EVAL_METHOD_PATH (and NLTK data for the server)."""
    return {**child_env(write_punkt(tmp_path_factory.mktemp("nltk"))), **cli_env(),
            "RF_EVAL_METHOD_PATH": str(PLUGINS)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """(target, source): two tiny Llamas of one tokenizer."""
    from rf_eval.testing import make_tiny_pair

    source, target = make_tiny_pair("llama", tmp_path_factory.mktemp("pair"))
    return str(target), str(source)


def lm_eval(tmp_path: Path, env: dict[str, str], model_args: str) -> dict:
    out = tmp_path / "out"
    argv = [LM_EVAL, "--model", "prefill", "--model_args", model_args, "--tasks", TASK, "--include_path",
            str(cost_task(tmp_path / "task")), "--device", "cpu", "--log_samples", "--output_path", str(out)]
    proc = run_argv(argv, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(out.rglob("results_*.json")).read_text())


def test_the_methods_table_lists_both_with_what_they_load_and_their_knob(env):
    listed = run_argv([sys.executable, "-m", "rf_eval", "methods"], env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert ("| `every_kth` | `--model prefill` `method=every_kth` | - | keep, keep_share, budget, k | the kept rows, "
            "in place of k | rf_eval.methods.every_kth |") in listed.stdout
    assert "| `source_rows` | `--model prefill` `method=source_rows` | source |" in listed.stdout


def test_a_dropper_in_one_file_runs_through_lm_eval_with_its_arm_and_cost(pair, env, tmp_path):
    target, _ = pair
    results = lm_eval(tmp_path, env, f"pretrained={target},method=every_kth,k=3")
    arm = results["config"]["rf_eval"]
    assert (arm["method"], arm["k"], arm["model_type"]) == ("every_kth", 3, "llama")
    found = samples(tmp_path / "out")
    assert len(found) == 3
    for sample in found:  # its own cost: ceil(n / 3) rows prefilled, and cached
        n = sample["prompt_tokens"]
        assert n > 30 and sample["exact_rows"] == math.ceil(n / 3)
        assert sample["cache_fraction"] == pytest.approx(math.ceil(n / 3) / n) and sample["macs_fraction"] < 0.5


def test_a_method_that_loads_a_second_model_runs_through_lm_eval(pair, env, tmp_path):
    target, source = pair
    results = lm_eval(tmp_path, env, f"pretrained={target},method=source_rows,source={source},keep_share=0.5")
    arm = results["config"]["rf_eval"]
    assert (arm["method"], arm["keep_share"], arm["source_path"]) == ("source_rows", 0.5, source)
    for sample in samples(tmp_path / "out"):  # the source's prefill is charged beside the rows kept
        n = sample["prompt_tokens"]
        assert sample["exact_rows"] == n // 2 and sample["macs_fraction"] > sample["cache_fraction"]


def test_a_method_in_one_file_is_served_with_its_own_arm_fields(pair, env, tmp_path):
    target, _ = pair
    served = start_server(target, tmp_path / "served", env, "--model-args", "method=every_kth,k=2")
    try:
        prompt = " ".join(["the river runs past the old stone house"] * 6)
        status, body = post(served.url + "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                                                              "rf_arm": {"k": 4}})
        assert status == 200 and body["rf_arm"]["k"] == 4 and body["rf_arm"]["method"] == "every_kth", body
        assert body["choices"][0]["text"] is not None
        status, body = post(served.url + "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                                                              "rf_arm": {"kk": 3}})
        assert status == 400 and "valid fields: keep, keep_share, budget, k" in json.dumps(body), body
    finally:
        served.stop()


STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [{task}]
include_path: {tasks}
arms:
  exact: {{args: {{fill: exact}}}}
  kth: {{model: prefill, args: {{method: every_kth, k: 2}}}}
budgets: [0.5, 0.8]
reference: exact
margin: 5.0
"""


def test_a_method_in_one_file_runs_in_a_study_with_budgets_and_is_reported(pair, env, tmp_path):
    target, _ = pair
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(model=target, task=TASK, tasks=cost_task(tmp_path / "task")))
    runs = tmp_path / "runs"
    ran = run_argv([sys.executable, "-m", "rf_eval", "study", "run", str(study), "--out", str(runs)], env=env,
                   timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    arms = runs / "arms"
    assert sorted(p.name for p in arms.iterdir()) == ["exact", "kth@0.5", "kth@0.8"]  # k left out: the budget sets it
    for budget in (0.5, 0.8):  # the kept rows the budget pays for: within it at every prompt, and near it
        got = samples(arms / f"kth@{budget:g}")
        assert got and all(budget - 0.2 < s["macs_fraction"] <= budget and s["budget"] == budget for s in got)
    assert "kth@0.5" in (runs / "report.md").read_text()  # the study's own report
    report = run_argv([sys.executable, "-m", "rf_eval", "report", *map(str, sorted(arms.iterdir())), "--reference",
                       "exact", "--markdown", str(tmp_path / "report.md"), "--html", str(tmp_path / "report.html")],
                      env=env, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    table = (tmp_path / "report.md").read_text()
    assert "kth@0.5" in table and "kth@0.8" in table
