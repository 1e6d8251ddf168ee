"""`lm_eval --model local-completions` against `rf-eval serve` on ruler_filled (serving prompts) gives the same
generations as `--model ridgefill` with the same arm, and the two runs pair in the report's statistics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from serving_helpers import post
from warm_start import popen_argv

TASK = "niah_single_1_filled"
META = {"max_seq_lengths": [512], "tail": 64, "protocol": "serving"}
ARM = {"fill": "identity", "tail": 64}
LIMIT = 3
MAX_GEN = 16


def lm_eval_command() -> list[str]:
    script = Path(sys.executable).with_name("lm_eval")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lm_eval"]


def run_ridgefill_in_process(model_dir: str, out: Path) -> None:
    """The `ridgefill` arm through lm-eval's evaluator, as its CLI calls it, with only rf-eval's tasks indexed."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from rf_eval.model_adapters.startup import tasks_dir

    model_args = {"pretrained": model_dir, **ARM}
    manager = TaskManager(include_path=tasks_dir(), include_defaults=False, metadata={**model_args, **META})
    tracker = EvaluationTracker(output_path=str(out))
    results = simple_evaluate(model="ridgefill", model_args=model_args, tasks=[TASK], task_manager=manager,
                              limit=LIMIT, apply_chat_template=True, gen_kwargs={"max_gen_toks": MAX_GEN},
                              log_samples=True, evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name=TASK, samples=samples[TASK])


def read_samples(folder: Path) -> dict[int, dict]:
    (path,) = folder.rglob(f"samples_{TASK}_*.jsonl")
    return {row["doc_id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_local_completions_matches_ridgefill_and_pairs(exact_server, serve_model_dir, serve_env, tmp_path):
    spec = ";".join(f"{k}={v}" for k, v in ARM.items())
    base_url = f"{exact_server.url}/arm/{spec}/v1/completions"  # lm-eval cannot add body fields: the arm rides the URL
    model_args = f"model=tiny,tokenizer={serve_model_dir},base_url={base_url},tokenizer_backend=huggingface"
    cmd = [*lm_eval_command(), "--model", "local-completions", "--model_args", model_args, "--tasks", TASK,
           "--metadata", json.dumps(META), "--limit", str(LIMIT), "--apply_chat_template",
           "--gen_kwargs", f"max_gen_toks={MAX_GEN}", "--log_samples", "--output_path", str(tmp_path / "api")]
    proc = popen_argv(cmd, stdout=tmp_path / "lm_eval.log", env=serve_env, cwd=tmp_path)
    try:
        run_ridgefill_in_process(serve_model_dir, tmp_path / "rf")  # meanwhile, in this process
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (tmp_path / "lm_eval.log").read_text()[-4000:]

    api, rf = read_samples(tmp_path / "api"), read_samples(tmp_path / "rf")
    assert sorted(api) == sorted(rf) == list(range(LIMIT))
    for doc_id in rf:
        a, r = api[doc_id], rf[doc_id]
        assert a["resps"] == r["resps"] and a["filtered_resps"] == r["filtered_resps"], doc_id
        assert (a["doc_hash"], a["prompt_hash"]) == (r["doc_hash"], r["prompt_hash"]), doc_id
        assert (a["filled"], a["needle_rows_from_end"]) == (r["filled"], r["needle_rows_from_end"]), doc_id
    assert all(len(r["resps"][0][0]) > 0 for r in rf.values())

    # the server ran the arm the URL named, and that arm matters: the exact arm answers differently
    served = [rec for rec in exact_server.records() if rec.get("arm_source") == "path" and rec["status"] == 200
              and rec["arm"]["tail"] == 64]
    assert len(served) >= LIMIT and all(rec["arm"]["fill"] == "identity" and rec["prefill_seconds"] > 0 for rec in served)
    exact = []
    for r in rf.values():
        context = r["arguments"]["gen_args_0"]["arg_0"]
        body = {"prompt": context, "max_tokens": MAX_GEN, "temperature": 0, "stop": ["<|im_end|>"], "rf_arm": {"fill": "exact"}}
        exact.append(post(exact_server.url + "/v1/completions", body)[1]["choices"][0]["text"])
    assert exact != [r["resps"][0][0] for r in rf.values()]

    # and the two runs pair item by item in the report's statistics
    from rf_eval.stats.pairing import pair_arms
    from rf_eval.stats.runs import load_runs

    runs = load_runs([tmp_path / "api", tmp_path / "rf"])
    names = {arm.model: arm.name for arm in runs.arms}
    pairs = pair_arms(runs.items, names["local-completions"], names["ridgefill"])
    assert len(pairs) == LIMIT and pairs.attrs["unpaired"] == 0
    assert (pairs["arm"] == pairs["ref"]).all()
