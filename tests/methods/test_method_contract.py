"""Every registered prefill method keeps the `Method` contract (#39 item 4, #53), and the method registry's rules.

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

from rf_eval.cost.prefill_cost import PrefillCost
from rf_eval.methods import (
    METHODS,
    MODELS,
    Method,
    MethodPluginError,
    chosen_method,
    method_class,
    method_for_arm,
    register_method,
    unregister_method,
)
from rf_eval.methods.requests import generate

N = 40  # prompt tokens: longer than every example arm's exact tail or kept rows, and than two 16-row blocks
#: name -> (arm fields, parts the adapter would load: "source" a smaller model, "maps" fitted transfer maps)
EXAMPLES = {
    "ridgefill": ({"fill": "identity", "split": 2, "tail": 4}, ()),
    "pop": ({}, ()),
    "fastkv": ({"selector": "tsp(keep=6)"}, ()),
    "rarecache": ({"rho": 0.3}, ("source", "maps")),
    "gemfilter": ({"keep": 6, "filter_layer": 1}, ()),
    "specprefill": ({"keep_share": 0.25, "chunk": 4}, ("source",)),
    "sinkwindow": ({"block": 16, "sink": 0, "window": 0}, ()),
    "flexprefill": ({"block": 16, "min_budget": 16}, ()),
    "xattention": ({"block": 16, "stride": 4, "threshold": 0.5}, ()),
}
#: the methods whose every prompt is plain (the stock model's prefill)
PLAIN = ("exact",)


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


def test_the_built_in_methods_are_ten_each_one_class_registered_as_a_third_party_s():
    from importlib.metadata import entry_points

    built_in = {e.name: e.value for e in entry_points(group="rf_eval.methods")}
    assert sorted(built_in) == ["exact", "fastkv", "flexprefill", "gemfilter", "pop", "rarecache", "ridgefill",
                              "sinkwindow", "specprefill", "xattention"]
    for name, target in built_in.items():
        cls = METHODS[name]
        assert issubclass(cls, Method) and f"{cls.__module__}:{cls.__qualname__}" == target


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_keeps_the_prefill_protocol(name, pair):
    cls = method_class(name)
    fields, needs = EXAMPLES.get(name, ({}, ()))
    arm = cls.parse_arm(fields)
    assert set(fields) <= set(cls.arm_fields())
    method = cls(pair["target"], pair["tokenizer"], arm, **{part: pair[part] for part in needs})
    assert isinstance(method, Method) and type(method.arm) is type(arm)  # resolved against the model where it needs to be
    ids = torch.randint(5, pair["target"].config.vocab_size, (1, N), generator=torch.Generator().manual_seed(0))
    plan = method.plan(N)
    assert plan.n == N and plan.plain == method.is_plain(N) == (name in PLAIN)  # the example arm changes the prompt
    result = method.prefill(ids, plan=plan)
    assert result.cache is not None and result.logits.shape == (1, pair["target"].config.vocab_size)
    assert torch.isfinite(result.logits).all()
    more = method.extend(result, torch.tensor([[7, 8]]))
    assert more.shape[:2] == (1, 2) and torch.isfinite(more).all()
    cost = method.prefill_cost(N, result, plan)
    assert isinstance(cost, PrefillCost) and cost.prompt_tokens == N
    assert 0 < cost.prefill_macs and cost.exact_macs > 0 and 0 < cost.cache_entries <= cost.exact_cache_entries
    assert (cost.prefill_macs == cost.exact_macs) == plan.plain
    out = generate(method, ids, max_new_tokens=2, do_sample=False)  # a generation prefill, then the stock decode
    assert out.shape == (1, N + 2) and torch.equal(out[:, :N], ids)
    info = method.provenance()
    assert info["method"] == name
    assert {"model_type", "model_name", "weights_sha256"} <= set(info)
    assert method.rebuilt(method.arm) is method and type(method.rebuilt(method.updated_arm({}))) is cls


class Exact(Method):
    """A throwaway method: every row prefilled exactly, yet not plain (the shells take the method's path)."""

    name = "throwaway_exact"

    @dataclass(frozen=True)
    class Arm:
        tail: int = 4

    def is_plain(self, n: int) -> bool:
        return False

    def prefill(self, input_ids, *, for_generation=False, held_back=0, plan=None):
        from rf_eval.engine import plain_prefill

        return plain_prefill(self.model, input_ids.to(self.device))

    def prefill_cost(self, n, result=None, plan=None):
        from rf_eval.cost.mac_model import cache_rows, prefill_macs

        macs, rows = prefill_macs(self.model.config, n), cache_rows(self.model.config, n)
        return PrefillCost(n, macs, macs, n, rows, rows)


def test_a_method_registered_at_run_time_is_found_built_and_refused_twice(tiny_model):
    model, tokenizer = tiny_model("llama")
    register_method(Exact)
    try:
        assert method_class("throwaway_exact") is Exact
        assert chosen_method({"method": "throwaway_exact"}) == (Exact, {})
        arm = Exact.parse_arm({"tail": "7"})  # model_args' strings, coerced to the field's type
        method = Exact(model, tokenizer, arm)
        assert arm.tail == 7 and method.updated_arm({"tail": 2}).tail == 2
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

    class OldCost(Exact):
        name = "old_cost"

        def prefill_cost(self, n, result=None):
            return super().prefill_cost(n, result)

    class TakesAnAdaptersName(Exact):
        name = "drop"

    for cls, says in ((NoPrefill, "must define prefill, prefill_cost, is_plain"),
                      (OldCost, "prefill_cost must take plan=None"), (TakesAnAdaptersName, "takes the name")):
        with pytest.raises(MethodPluginError, match=says):
            register_method(cls)
        assert cls.name not in METHODS


def test_a_study_arm_finds_its_method():
    assert method_for_arm("drop", {})[0].name == "gemfilter"  # the lm-eval name's default method
    assert method_for_arm("drop", {"method": "specprefill"})[0].name == "specprefill"
    assert method_for_arm("ridgefill", {"fill": "ridge"}) == (METHODS["ridgefill"], {"fill": "ridge"})
    assert method_for_arm("prefill", {"method": "gemfilter"})[0].name == "gemfilter"  # one adapter runs every method
    assert method_for_arm("ridgefill", {"preset": "fastkv", "budget": 0.5}) == (METHODS["fastkv"], {"budget": 0.5})
    assert method_for_arm("hf", {}) is None and method_for_arm("prefill", {}) is None


def test_an_unknown_method_names_the_known_ones_and_the_path_variable():
    with pytest.raises(MethodPluginError) as err:
        method_class("ridgefil")
    assert "ridgefill" in str(err.value) and "RF_EVAL_METHOD_PATH" in str(err.value)
    with pytest.raises(MethodPluginError, match="--model drop is an lm-eval model name; its method is gemfilter"):
        method_class("drop")


def test_every_lm_eval_name_is_the_one_adapter_with_its_default_method():
    from lm_eval.api.registry import get_model

    from rf_eval.model_adapters.prefill_lm import PrefillLM

    for name, default in MODELS.items():
        named = get_model(name)
        assert named.name == name and named.create_from_arg_obj.__func__.__qualname__.startswith("ModelName")
        assert PrefillLM.create_from_arg_obj.__self__ is PrefillLM
        if default is not None:
            assert chosen_method({}, name)[0].name == default


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
        assert arm.info["tail"] == 2 and arm.method.arm.tail == 2
        ids = list(range(5, 20))
        out = backend.generate(ids, arm, GenParams(max_tokens=3))
        model, _ = tiny_model("llama")
        expected = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)[0, len(ids):].tolist()
        assert out.tokens == expected
        app = create_app(backend)  # /rf/info names the method
        info = asyncio.run(next(r.endpoint for r in app.routes if getattr(r, "path", "") == "/rf/info")())
        assert (info["method"], info["maps"], info["arm_fields"]) == ("throwaway_exact", None, ["tail"])
    finally:
        unregister_method("throwaway_exact")


@pytest.mark.parametrize("args, says", [
    ({}, "--model prefill needs method="),
    ({"method": "ridgefil"}, "'ridgefil' is not a prefill method"),
    ({"method": "rarecache"}, r"method=rarecache needs source=, maps="),
    ({"method": "throwaway_exact", "tial": "3"}, "did you mean 'tail'"),
    ({"method": "throwaway_exact", "tail": "x"}, "tail='x' has the wrong type"),
    ({"method": "throwaway_exact", "seed": "x"}, "seed='x' is not an integer"),
    ({"method": "throwaway_exact", "rho": "0.3"}, "rho='0.3' is a key of method=rarecache, not of method=throwaway"),
])
def test_the_adapter_refuses_bad_model_args_before_the_weights_load(args, says, tiny_model_dir):
    from rf_eval.model_adapters.config import ModelArgsError, parse_model_args

    register_method(Exact)
    try:
        with pytest.raises(ModelArgsError, match=says):
            parse_model_args({"pretrained": tiny_model_dir("llama"), **args})
        settings, _ = parse_model_args({"pretrained": tiny_model_dir("llama"), "method": "throwaway_exact",
                                        "tail": "5", "seed": "3"})
        assert (settings.method, settings.arm, settings.seed) == (Exact, Exact.Arm(tail=5), 3)
    finally:
        unregister_method("throwaway_exact")
