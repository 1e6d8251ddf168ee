"""All four protocols end to end through the lm_eval CLI on a tiny model (runs started by conftest)."""

from __future__ import annotations

import ast

import pytest


@pytest.fixture(scope="module")
def runs(cli_runs, th):
    return {name: th.finish(proc, out) for name, (proc, out) in cli_runs.items()}


def parse(resp):
    return ast.literal_eval(resp) if isinstance(resp, str) else resp


def test_ruler_filled_same_subset_on_hf_and_ridgefill(runs):
    flags = {}
    for name in ("hf", "ridgefill"):
        res = runs[name]["results"]["results"]["niah_single_1_filled"]
        samples = runs[name]["samples"]["niah_single_1_filled"]
        assert len(samples) == 2
        assert res["n_filled,none"] + res["n_excluded,none"] == 2
        assert res["n_filled_1024,none"] == res["n_filled,none"]
        flags[name] = {s["doc_id"]: (s["filled"], s["needle_rows_from_end"]) for s in samples}
        for s in samples:
            assert (s["acc_filled"] is None) == (s["filled"] == 0)
            assert s["filled"] == int(s["needle_rows_from_end"] >= 300)
    assert flags["hf"] == flags["ridgefill"]  # one subset for every model run on this tokenizer


def test_keytoken_exact_against_itself(runs):
    res = runs["ridgefill"]["results"]["results"]["keytoken_nll"]
    assert res["dnll_all,none"] == 0.0 and res["kl,none"] == 0.0 and res["top1_agree,none"] == 1.0
    samples = runs["ridgefill"]["samples"]["keytoken_nll"]
    assert len(samples) == 2
    for s in samples:
        full = parse(s["filtered_resps"][0])
        assert full["logprobs"] == full["exact_logprobs"] and len(full["tokens"]) == 128


def test_second_question_runs_on_the_carried_cache(runs):
    res = runs["ridgefill"]["results"]["results"]["ruler_second_question"]
    assert res["n_second_filled,none"] + res["n_second_tail,none"] == 2
    for s in runs["ridgefill"]["samples"]["ruler_second_question"]:
        out = parse(s["filtered_resps"][0])
        assert len(out["answers"]) == 2 and out["answers"] == out["exact_answers"]
        turns = s["arguments"]["gen_args_0"]["arg_0"]
        assert len(turns) == 2 and "What is the special magic number for" in turns[1]


@pytest.mark.parametrize("name", ["hf", "ridgefill"])
def test_longbench_two_passes(runs, name):
    res = runs[name]["results"]["results"]["longbench_v2_cot"]
    assert {"acc,none", "acc_easy,none", "acc_hard,none", "answered,none"} <= set(res)
    assert runs[name]["results"]["configs"]["longbench_v2_cot"]["metadata"]["prompt_wording"] == "unofficial wording"
    for s in runs[name]["samples"]["longbench_v2_cot"]:
        out = parse(s["filtered_resps"][0])
        assert {"cot", "response", "prompt_2"} <= set(out)
        context = s["doc"]["context"]
        marker = context.split()[0]  # BEGIN-<i>, the document's first word
        assert marker not in out["prompt_2"] and context[200:260] not in out["prompt_2"]
        prompt_1 = s["arguments"]["gen_args_0"]["arg_0"]
        assert marker in prompt_1 and context.split()[-1] in prompt_1  # middle cut keeps both ends


def test_longbench_seeds_shared_by_arms(runs):
    """Sampling at temperature 0.1 with per-item seeds: the exact arm draws what `hf` draws."""
    by_model = {
        name: {s["doc_id"]: parse(s["filtered_resps"][0]) for s in runs[name]["samples"]["longbench_v2_cot"]}
        for name in ("hf", "ridgefill")
    }
    assert by_model["hf"].keys() == by_model["ridgefill"].keys()
    for doc_id, out in by_model["hf"].items():
        assert out["cot"] == by_model["ridgefill"][doc_id]["cot"]
        assert out["response"] == by_model["ridgefill"][doc_id]["response"]


def _answer(task: str, sample: dict) -> str:
    """The answer whose length cap `cap_hits` records: RULER's reply, the second question's second reply,
    LongBench's first (CoT) pass."""
    resp = sample["filtered_resps"][0]
    if task == "ruler_second_question":
        return parse(resp)["answers"][1]
    return parse(resp)["cot"] if task == "longbench_v2_cot" else resp


@pytest.mark.parametrize("name, task", [("hf", "niah_single_1_filled"), ("hf", "longbench_v2_cot"),
                                        ("ridgefill", "niah_single_1_filled"),
                                        ("ridgefill", "ruler_second_question"), ("ridgefill", "longbench_v2_cot")])
def test_generation_tasks_record_cap_hits(runs, name, task):
    """Each sample logs `cap_hits` (the cap rule of `common.cap_hit` on its answer, with the run's tokenizer and
    the cap the run set); lm-eval's aggregate is their count (paper sections 4.5, 4.6)."""
    from transformers import AutoTokenizer

    from rf_eval.stats.arms import parse_model_args
    from rf_eval.tasks.common import cap_hit

    results = runs[name]["results"]
    tok = AutoTokenizer.from_pretrained(parse_model_args(results["config"]["model_args"])["pretrained"])
    config = results["configs"][task]
    cap = config["metadata"]["cot_tokens"] if task == "longbench_v2_cot" else config["generation_kwargs"]["max_gen_toks"]
    assert cap == 16  # --gen_kwargs max_gen_toks=16 / cot_tokens 16
    flags = [s["cap_hits"] for s in runs[name]["samples"][task]]
    assert len(flags) == 2 and set(flags) <= {0, 1}
    assert flags == [cap_hit(tok, _answer(task, s), cap) for s in runs[name]["samples"][task]]
    assert results["results"][task]["cap_hits,none"] == sum(flags)
    assert results["higher_is_better"][task]["cap_hits"] is False
