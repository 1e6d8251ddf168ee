"""`--model drop` (issue #40): GemFilter and Speculative Prefill through lm-eval's evaluator on the tiny Llama and
Qwen3, on the needle task and keytoken_nll, each sample recording what the dropper kept and spent; their bad
settings refused before any weights load."""

from __future__ import annotations

import pytest

OPTS = {"score_tokens": 64, "key_context": 256, "max_seq_lengths": [512], "tail": 64}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """family -> (target folder, speculator folder), one tokenizer each (`make_tiny_pair`)."""
    from rf_eval.testing import make_tiny_pair

    pairs = {family: make_tiny_pair(family, tmp_path_factory.mktemp(f"drop_{family}")) for family in ("llama", "qwen3")}
    return {family: (str(target), str(source)) for family, (source, target) in pairs.items()}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("args", [{"method": "gemfilter", "keep": 160}, {"method": "specprefill", "keep_share": 0.3},
                                  {"method": "gemfilter", "budget": 0.6}])
def test_droppers_run_through_lm_eval(family, args, pairs, task_data, th):
    from lm_eval import simple_evaluate

    from rf_eval.model_adapters import prefill_lm
    target, speculator = pairs[family]
    extra = {"source": speculator} if args["method"] == "specprefill" else {}
    lm = prefill_lm.drop(pretrained=target, device="cpu", reference="exact", **args, **extra)
    meta = {**OPTS, "pretrained": target, "essay_haystack": str(task_data["essays"]), "docs": str(task_data["docs"]),
            "reference": "exact"}
    out = simple_evaluate(model=lm, tasks=["niah_single_1_filled", "keytoken_nll"], task_manager=th.task_manager(meta),
                          log_samples=True, bootstrap_iters=0, verbosity="WARNING", limit=2)
    for task, samples in out["samples"].items():
        for s in samples:
            n = s["prompt_tokens"]
            assert 0 < s["exact_rows"] < n and s["macs_fraction"] < 1 and s["cache_fraction"] == s["exact_rows"] / n, (task, {k: s[k] for k in ("prompt_tokens", "prefill_macs", "exact_macs", "exact_rows")})
            if "budget" in args:
                assert s["macs_fraction"] <= 0.6 and s["budget"] == 0.6
        if task == "keytoken_nll":
            assert all(s["kl"] is not None and s["kl"] >= 0 and s["nll_all"] > 0 for s in samples)
        else:
            assert all(s["acc_all"] in (0.0, 1.0) for s in samples)
    info = out["config"]["rf_eval"]
    assert info["method"] == args["method"] and info["weights_sha256"]


@pytest.mark.parametrize("args, says", [
    ({"method": "bogus"}, "method='bogus' is not a prefill method"),
    ({"method": "gemfilter", "keep": 0}, "keeps at least 1 row"),
    ({"method": "gemfilter", "keep_share": 2}, "0 < keep_share <= 1"),
    ({"method": "gemfilter", "filter_layer": 9}, "filter_layer=9 is outside 0..4"),
    ({"method": "gemfilter", "budget": 0.01}, "budget=0.01 is below the cheapest"),
    ({"method": "specprefill"}, "needs source="),
    ({"method": "gemfilter", "source": "SPEC"}, "source='.*' is a key of method=rarecache or specprefill, not of method=gemfilter"),
    ({"method": "specprefill", "source": "OTHER"}, "share a tokenizer"),
])
def test_bad_drop_settings_are_refused_before_the_weights_load(args, says, pairs, tmp_path, monkeypatch):
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.model_adapters import prefill_lm
    from rf_eval.model_adapters.config import ModelArgsError
    target, speculator = pairs["llama"]
    other = None
    if args.get("source") == "OTHER":  # the speculator with one token more in its tokenizer
        other = str(tmp_path / "other")
        shutil.copytree(speculator, other)
        tok = AutoTokenizer.from_pretrained(other)
        tok.add_tokens(["<|extra|>"])
        tok.save_pretrained(other)
    args = {**args, **({"source": {"SPEC": speculator, "OTHER": other}[args["source"]]} if "source" in args else {})}
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match=says):
        prefill_lm.drop(pretrained=target, device="cpu", **args)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fastkv_runs_through_lm_eval(family, pairs, task_data, th):
    """FastKV's propagation (`--model ridgefill`, preset=fastkv): the late layers keep the propagated rows only."""
    from lm_eval import simple_evaluate

    from rf_eval.model_adapters import prefill_lm
    target = pairs[family][0]
    lm = prefill_lm.ridgefill(pretrained=target, device="cpu", preset="fastkv", selector="tsp(keep=96)", reference="exact")
    meta = {**OPTS, "pretrained": target, "essay_haystack": str(task_data["essays"]), "docs": str(task_data["docs"]),
            "reference": "exact", "subset_tail": 64}
    meta.pop("tail")
    out = simple_evaluate(model=lm, tasks=["niah_single_1_filled", "keytoken_nll"], task_manager=th.task_manager(meta),
                          log_samples=True, bootstrap_iters=0, verbosity="WARNING", limit=2)
    layers = lm.model.config.num_hidden_layers
    for samples in out["samples"].values():
        for s in samples:
            n = s["prompt_tokens"]
            assert s["exact_rows"] == 96 and s["macs_fraction"] < 1
            assert s["cache_entries"] == (layers // 2) * n + (layers - layers // 2) * 96  # the late layers: 96 rows
    assert out["config"]["rf_eval"]["selector"]["name"] == "tsp" and out["config"]["rf_eval"]["preset"] == "fastkv"
