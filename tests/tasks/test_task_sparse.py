"""`--model prefill --model_args method=flexprefill|xattention|sinkwindow` (issue #56): the sparse family through
lm-eval's evaluator on the tiny Llama and Qwen3, on the needle task and keytoken_nll, each sample recording its
attention density and MACs; their bad settings refused before any weights load."""

from __future__ import annotations

import pytest

OPTS = {"score_tokens": 64, "key_context": 256, "max_seq_lengths": [512], "tail": 64}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from rf_eval.testing import make_tiny_model

    return {family: str(make_tiny_model(family, tmp_path_factory.mktemp(f"sparse_{family}"), seed=0))
            for family in ("llama", "qwen3")}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("args", [{"method": "sinkwindow", "window": 4}, {"method": "sinkwindow", "budget": 0.95},
                                  {"method": "flexprefill", "min_budget": 64}, {"method": "xattention", "stride": 8}])
def test_sparse_methods_run_through_lm_eval(family, args, models, task_data, th):
    from lm_eval import simple_evaluate

    from rf_eval.model_adapters import prefill_lm
    lm = prefill_lm.prefill(pretrained=models[family], device="cpu", reference="exact", block=32, **args)
    meta = {**OPTS, "pretrained": models[family], "essay_haystack": str(task_data["essays"]),
            "docs": str(task_data["docs"]), "reference": "exact"}
    out = simple_evaluate(model=lm, tasks=["niah_single_1_filled", "keytoken_nll"], task_manager=th.task_manager(meta),
                          log_samples=True, bootstrap_iters=0, verbosity="WARNING", limit=2)
    for task, samples in out["samples"].items():
        for s in samples:
            assert 0 < s["attention_density"] < 1, (task, s["attention_density"])
            if args["method"] == "sinkwindow":  # no estimation pass: fewer pairs is fewer MACs
                assert s["macs_fraction"] < 1
            assert s["cache_fraction"] == 1.0 and s["exact_rows"] == s["prompt_tokens"]
            if "budget" in args:
                assert s["macs_fraction"] <= 0.95 and s["budget"] == 0.95
        if task == "keytoken_nll":
            assert all(s["kl"] is not None and s["kl"] >= 0 and s["nll_all"] > 0 for s in samples)
        else:
            assert all(s["acc_all"] in (0.0, 1.0) for s in samples)
    info = out["config"]["rf_eval"]
    assert info["method"] == args["method"] and info["block"] == 32 and info["sparse_layers"]


@pytest.mark.parametrize("args, says", [
    ({"method": "sinkwindow", "block": 48}, "block=48: give a power of two >= 16"),
    ({"method": "xattention", "block": 8}, "block=8: give a power of two >= 16"),
    ({"method": "sinkwindow", "sink": -1}, "sink and window count blocks"),
    ({"method": "sinkwindow", "window": 2, "budget": 0.5}, "give window or budget, not both"),
    ({"method": "sinkwindow", "budget": 1.5}, "0 < budget <= 1"),
    ({"method": "sinkwindow", "budget": 0.01}, "budget=0.01 is below the cheapest"),
    ({"method": "flexprefill", "gamma": 0}, "gamma=0.*give 0 < gamma <= 1"),
    ({"method": "flexprefill", "gamma": 1.2}, "gamma=1.2.*give 0 < gamma <= 1"),
    ({"method": "flexprefill", "tau": -0.1}, "tau=-0.1.*give 0 <= tau <= 1"),
    ({"method": "flexprefill", "min_budget": 512, "max_budget": 256}, "give 1 <= min_budget <= max_budget"),
    ({"method": "flexprefill", "budget": 0.02}, "budget=0.02 is below the cheapest"),
    ({"method": "xattention", "budget": 0.02}, "budget=0.02 is below the cheapest"),
    ({"method": "xattention", "threshold": 0}, "threshold=0.*give 0 < threshold <= 1"),
    ({"method": "xattention", "stride": 0}, "stride=0: give a stride >= 1 that divides block=128"),
    ({"method": "xattention", "stride": 48}, "stride=48: give a stride >= 1 that divides block=128"),
    ({"method": "xattention", "gamma": 0.9}, "gamma"),
])
def test_bad_sparse_settings_are_refused_before_the_weights_load(args, says, models, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match=says):
        prefill_lm.prefill(pretrained=models["llama"], device="cpu", **args)


def test_a_family_with_attention_sinks_is_refused_by_name(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    from rf_eval.testing import make_tiny_model
    folder = make_tiny_model("gpt_oss", tmp_path, seed=0)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    for method in ("sinkwindow", "flexprefill", "xattention"):
        with pytest.raises(ModelArgsError, match=f"method={method}: GptOss.* attention has per-head sinks"):
            prefill_lm.prefill(pretrained=str(folder), device="cpu", method=method)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_fill_with_sparse_lower_layers_runs_through_lm_eval(family, models, task_data, th):
    """`--model ridgefill --model_args fill=identity,...,sparse=flexprefill(...)`: one arm, both savings."""
    from lm_eval import simple_evaluate

    from rf_eval.model_adapters import prefill_lm
    args = {"fill": "identity", "split": 3, "tail": 64, "reference": "exact"}
    meta = {**OPTS, "pretrained": models[family], "essay_haystack": str(task_data["essays"]),
            "docs": str(task_data["docs"]), "reference": "exact"}
    # both adapters built first: each run's samples carry its own adapter's costs (the one that recorded them)
    adapters = [prefill_lm.ridgefill(pretrained=models[family], device="cpu", **args, **sparse)
                for sparse in ({"sparse": "flexprefill(block=32;min_budget=64)"}, {})]
    runs = [simple_evaluate(model=lm, tasks=["keytoken_nll"], task_manager=th.task_manager(meta), log_samples=True,
                            bootstrap_iters=0, verbosity="WARNING", limit=2) for lm in adapters]
    (samples,), (fill_only,) = (list(out["samples"].values()) for out in runs)
    for s, f in zip(samples, fill_only):
        assert 0 < s["attention_density"] < 1 and f["attention_density"] is None
        assert s["prefill_macs"] < f["prefill_macs"] and s["exact_rows"] == f["exact_rows"]
    assert runs[0]["config"]["rf_eval"]["sparse"] == {"name": "flexprefill", "block": 32, "min_budget": 64}
