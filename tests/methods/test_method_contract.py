"""Every registered prefill method keeps the `PrefillMethod` contract (#39 item 4), and the method registry's rules.

Parametrized over the registry (kvpress's `default_presses` idea): a method found later (in the package, on
RF_EVAL_METHOD_PATH, by an entry point) is tested here the moment it is found, with its arm's defaults;
`EXAMPLES` gives the built-in ones an arm that fills or drops rows of a short prompt and the parts their
adapters load (a source model, maps).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest
import torch

from rf_eval.method import PrefillMethod, generate
from rf_eval.methods import (
    ADAPTERS,
    METHODS,
    Method,
    MethodPluginError,
    adapter_name,
    method_class,
    method_for_arm,
    methods_of,
    register_method,
    unregister_method,
)
from rf_eval.prefill_cost import PrefillCost

N = 24  # prompt tokens: longer than every example arm's exact tail or kept rows
#: name -> (arm fields, parts the adapter would load: "source" a smaller model, "maps" fitted transfer maps)
EXAMPLES = {
    "ridgefill": ({"fill": "identity", "split": 2, "tail": 4}, ()),
    "rarecache": ({"rho": 0.3}, ("source", "maps")),
    "gemfilter": ({"keep": 6, "filter_layer": 1}, ()),
    "specprefill": ({"keep_share": 0.25, "chunk": 4}, ("source",)),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target, its smaller source (one tokenizer) and transfer maps fitted for the pair."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.rarecache.fit import fit_transfer
    from rf_eval.testing import make_tiny_pair

    source_dir, target_dir = make_tiny_pair("llama", tmp_path_factory.mktemp("method_pair"))
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    source = AutoModelForCausalLM.from_pretrained(source_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    docs = tmp_path_factory.mktemp("method_docs")
    rng, words = random.Random(0), "the river stone lamp seven blue quiet market paper ladder".split()
    paths = []
    for i in range(3):
        (docs / f"{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(40)))
        paths.append(str(docs / f"{i}.txt"))
    maps, _ = fit_transfer(source, target, tokenizer, tokenizer, paths, k=2, rank=8, lam=0.01,
                           out=tmp_path_factory.mktemp("method_maps"))
    return {"target": target, "tokenizer": tokenizer, "source": source, "maps": maps}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_keeps_the_prefill_protocol(name, pair):
    cls = method_class(name)
    fields, needs = EXAMPLES.get(name, ({}, ()))
    arm = cls.parse_arm(fields)
    assert set(fields) <= set(cls.arm_fields())
    method = cls.build(pair["target"], pair["tokenizer"], arm, **{part: pair[part] for part in needs})
    assert isinstance(method, PrefillMethod)
    ids = torch.randint(5, pair["target"].config.vocab_size, (1, N), generator=torch.Generator().manual_seed(0))
    assert isinstance(method.is_plain(N), bool) and not method.is_plain(N)  # the example arm changes this prompt
    result = method.prefill(ids)
    assert result.cache is not None and result.logits.shape == (1, pair["target"].config.vocab_size)
    assert torch.isfinite(result.logits).all()
    more = method.extend(result, torch.tensor([[7, 8]]))
    assert more.shape[:2] == (1, 2) and torch.isfinite(more).all()
    cost = method.prefill_cost(N, result)
    assert isinstance(cost, PrefillCost) and cost.prompt_tokens == N
    assert 0 < cost.prefill_macs and cost.exact_macs > 0 and 0 < cost.cache_entries <= cost.exact_cache_entries
    out = generate(method, ids, max_new_tokens=2, do_sample=False)  # a generation prefill, then the stock decode
    assert out.shape == (1, N + 2) and torch.equal(out[:, :N], ids)
    info = method.provenance()
    assert info["method"] == name
    assert {"model_type", "model_name", "weights_sha256"} <= set(info)
    assert cls.model in ADAPTERS and adapter_name(name) == cls.model


class Exact(Method):
    """A throwaway method: every row prefilled exactly, yet not plain (the shells take the method's path)."""

    name = "throwaway_exact"

    @dataclass(frozen=True)
    class Arm:
        tail: int = 4

    def is_plain(self, n: int) -> bool:
        return False

    def prefill(self, input_ids, *, for_generation=False, held_back=0):
        from rf_eval.engine import plain_prefill

        return plain_prefill(self.model, input_ids.to(self.device))

    def prefill_cost(self, n, result=None):
        from rf_eval.mac_model import cache_rows, prefill_macs

        macs, rows = prefill_macs(self.model.config, n), cache_rows(self.model.config, n)
        return PrefillCost(n, macs, macs, n, rows, rows)


def test_a_method_registered_at_run_time_is_found_built_and_refused_twice(tiny_model):
    model, tokenizer = tiny_model("llama")
    register_method(Exact)
    try:
        assert method_class("throwaway_exact") is Exact and "throwaway_exact" in methods_of("prefill")
        assert adapter_name("throwaway_exact") == "prefill"
        arm = Exact.parse_arm({"tail": "7"})  # model_args' strings, coerced to the field's type
        assert arm.tail == 7 and Exact.updated_arm(arm, {"tail": 2}).tail == 2
        method = Exact.build(model, tokenizer, arm)
        ids = torch.arange(5, 17)[None]
        result = method.prefill(ids)
        assert torch.allclose(result.logits, model(ids).logits[:, -1], atol=1e-5)  # lm_head over 1 row vs all
        assert method.provenance()["method"] == "throwaway_exact" and method.provenance()["tail"] == 7
        assert method.speedup_ceilings(12) == {"mac_ceiling": 1.0}

        class Again(Exact):
            pass

        with pytest.raises(MethodPluginError, match="already registered"):
            register_method(Again)
    finally:
        unregister_method("throwaway_exact")
    assert "throwaway_exact" not in METHODS


def test_a_method_that_breaks_the_contract_is_refused_in_one_line():
    class NoPrefill(Method):
        name = "no_prefill"

    class NoAdapter(Exact):
        name = "no_adapter"
        model = "nowhere"

    class TakesAnAdaptersName(Exact):
        name = "drop"

    for cls, says in ((NoPrefill, "must define prefill, is_plain, prefill_cost"),
                      (NoAdapter, "not an rf-eval lm-eval model"), (TakesAnAdaptersName, "takes the name")):
        with pytest.raises(MethodPluginError, match=says):
            register_method(cls)
        assert cls.name not in METHODS


def test_a_study_arm_finds_its_method():
    assert method_for_arm("drop", {}).name == "gemfilter"  # the droppers' arm's default
    assert method_for_arm("drop", {"method": "specprefill"}).name == "specprefill"
    assert method_for_arm("ridgefill", {"fill": "ridge"}).name == "ridgefill"
    assert method_for_arm("prefill", {"method": "gemfilter"}) is None  # runs as --model drop
    assert method_for_arm("hf", {}) is None and method_for_arm("prefill", {}) is None


def test_an_unknown_method_names_the_known_ones_and_the_path_variable():
    with pytest.raises(MethodPluginError) as err:
        method_class("ridgefil")
    assert "ridgefill" in str(err.value) and "RF_EVAL_METHOD_PATH" in str(err.value)
    assert adapter_name("drop") == "drop" and adapter_name("gemfilter") == "drop"


def test_the_server_builds_the_adapter_of_a_method_or_an_adapter_name():
    from rf_eval.model_adapters.drop import DropLM
    from rf_eval.model_adapters.method_lm import MethodLM
    from rf_eval.model_adapters.registry import adapter_args

    assert adapter_args({"pretrained": "m"})[1] == {"pretrained": "m"}  # ridgefill by default
    assert adapter_args({"method": "gemfilter", "keep": 4}) == (DropLM, {"method": "gemfilter", "keep": 4})
    assert adapter_args({"method": "drop", "keep": 4}) == (DropLM, {"keep": 4})
    register_method(Exact)
    try:
        assert adapter_args({"method": "throwaway_exact"}) == (MethodLM, {"method": "throwaway_exact"})
    finally:
        unregister_method("throwaway_exact")


def test_a_plugin_method_is_served_with_its_own_arm_fields(tiny_model_dir, tiny_model):
    """`rf-eval serve --model-args method=NAME`'s backend: the generic adapter, the method's arm fields as a
    request's `rf_arm`, and its greedy tokens the model's own (Exact prefills every row exactly)."""
    from rf_eval.serving.app import create_app
    from rf_eval.serving.backend import Backend, GenParams

    register_method(Exact)
    try:
        backend = Backend.from_model_args({"pretrained": tiny_model_dir("llama"), "method": "throwaway_exact",
                                           "device": "cpu", "dtype": "float32"}, max_batch=1)
        assert backend.arm_fields == ("tail",) and backend.default_arm.info["tail"] == 4
        arm = backend.arm({"tail": "2"})
        assert arm.info["tail"] == 2 and arm.method.spec.tail == 2
        ids = list(range(5, 20))
        out = backend.generate(ids, arm, GenParams(max_tokens=3))
        model, _ = tiny_model("llama")
        expected = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)[0, len(ids):].tolist()
        assert out.tokens == expected
        app = create_app(backend)  # /rf/info names the method, and its adapter
        info = asyncio.run(next(r.endpoint for r in app.routes if getattr(r, "path", "") == "/rf/info")())
        assert (info["method"], info["adapter"], info["maps"], info["arm_fields"]) == (
            "throwaway_exact", "prefill", None, ["tail"])
    finally:
        unregister_method("throwaway_exact")


@pytest.mark.parametrize("args, says", [
    ({}, "--model prefill needs method="),
    ({"method": "ridgefil"}, "'ridgefil' is not a prefill method"),
    ({"method": "rarecache"}, "runs as --model rarecache"),
    ({"method": "throwaway_exact", "tial": "3"}, "did you mean 'tail'"),
    ({"method": "throwaway_exact", "tail": "x"}, "tail='x' has the wrong type"),
    ({"method": "throwaway_exact", "seed": "x"}, "seed='x' is not an integer"),
])
def test_the_generic_adapter_refuses_bad_model_args_before_the_weights_load(args, says, tiny_model_dir):
    from rf_eval.model_adapters.config import ModelArgsError
    from rf_eval.model_adapters.method_lm import parse_method_args

    register_method(Exact)
    try:
        with pytest.raises(ModelArgsError, match=says):
            parse_method_args({"pretrained": tiny_model_dir("llama"), **args})
        settings, _ = parse_method_args({"pretrained": tiny_model_dir("llama"), "method": "throwaway_exact",
                                         "tail": "5", "seed": "3"})
        assert (settings.method, settings.arm, settings.seed) == (Exact, Exact.Arm(tail=5), 3)
    finally:
        unregister_method("throwaway_exact")
