"""An arm is one object, bound once (issue #39 item 1): its fill name becomes a fill method once per arm, never
per prompt; the engine gets the bound strategy, not a name; the exact reference pass reuses the loaded model
and the parsed arm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rf_eval.engine import plain_prefill
from rf_eval.fills.base import FillMethod
from rf_eval.method import generation_cache
from rf_eval.model_adapters.ridgefill import RidgeFillLM, parse_ridgefill_args
from rf_eval.ridgefill import api
from rf_eval.ridgefill import arm as arm_module
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.arm_spec import RidgeFillArm

TAIL = 4
LENGTHS = (3, 12, 17, 17, 24)  # one plain prompt (within the tail), two of one length


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed + n))


@pytest.fixture
def made(monkeypatch):
    """The count of fill-method objects made so far (`made()`), counted from here on."""
    count = [0]

    def counting_init(self, *args, **kwargs):
        count[0] += 1

    monkeypatch.setattr(FillMethod, "__init__", counting_init)
    return lambda: count[0]


@pytest.fixture
def engine_fills(monkeypatch):
    """Every `fill=` the engine was handed by the arm's prefill."""
    handed: list = []
    real = arm_module.engine.prefill

    def spy(model, input_ids, plan, fill=None, **kwargs):
        handed.append(fill)
        return real(model, input_ids, plan, fill=fill, **kwargs)

    monkeypatch.setattr(arm_module.engine, "prefill", spy)
    return handed


@pytest.mark.parametrize(("fields", "objects"), [
    ({"fill": "identity"}, 1),
    ({"fill": "nofill"}, 1),
    ({"fill": "identity", "selector": "attention(share=0.25;layers=0|1)+special"}, 1),
    ({"fill": "nofill", "cost_match": "identity"}, 2),  # the control's fill and the fill it is matched to
])
def test_the_fill_becomes_an_object_once_per_arm_and_never_per_prompt(tiny_model, made, engine_fills, fields,
                                                                       objects):
    model, tok = tiny_model("llama")
    arm = RidgeFillArm.from_fields({k: str(v) for k, v in {**fields, "tail": TAIL}.items()}, what="model_args")
    assert made() == objects
    arm = arm.resolve(model.config)
    rf = RidgeFill(model, tok, arm=arm)
    assert made() == objects, "resolving or binding the arm built its fill again"
    assert rf.spec.method is arm.method and rf.plan is rf.spec.plan
    for i, n in enumerate(LENGTHS):
        ids = prompt(n, i)
        result = rf.prefill(ids)
        rf.prefill_cost(n, result)
        rf.speedup_ceilings(n)
        generation_cache(rf, ids[0].tolist())
    assert made() == objects, "a prompt looked its fill up by name"
    assert engine_fills, "no prompt reached the engine"
    assert all(fill is rf.row_fill and fill is not None for fill in engine_fills), \
        "the engine was not handed the arm's one strategy"


def test_a_bound_arm_gives_the_results_of_the_engine_with_its_strategy_made_by_hand(tiny_model):
    """The strategy made once is the one a prompt made for itself before (bitwise)."""
    from rf_eval.engine import Plan, prefill
    from rf_eval.ridge.maps import identity_fill

    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, fill="identity", split=3, tail=TAIL)
    ids = prompt(24)
    by_hand = prefill(model, ids, Plan(split=3, tail=TAIL, fill="identity"), fill=identity_fill)
    got = rf.prefill(ids)
    assert torch.equal(got.logits, by_hand.logits) and torch.equal(got.exact_rows, by_hand.exact_rows)


def test_the_reference_pass_reuses_the_loaded_model_and_the_parsed_arm(tiny_model, made, monkeypatch):
    model, tok = tiny_model("llama")
    arm = RidgeFillArm.from_fields({"fill": "identity", "tail": str(TAIL), "chunk_size": "5",
                                    "selector": "attention(share=0.25;layers=0|1)"}, what="model_args").resolve(model.config)
    built, fingerprints, resolved = [], [], []
    real_init, real_fingerprint, real_resolve = RidgeFill.__init__, api.weights_fingerprint, RidgeFillArm.resolve
    monkeypatch.setattr(RidgeFill, "__init__", lambda self, *a, **k: (built.append(1), real_init(self, *a, **k))[1])
    monkeypatch.setattr(api, "weights_fingerprint", lambda m: (fingerprints.append(1), real_fingerprint(m))[1])
    monkeypatch.setattr(RidgeFillArm, "resolve", lambda self, *a, **k: (resolved.append(1),
                                                                         real_resolve(self, *a, **k))[1])
    adapter = SimpleNamespace(model=model, tokenizer=tok, settings=SimpleNamespace(arm=arm, maps=None, maps_obj=None))
    method, exact = RidgeFillLM.build_method(adapter)
    assert (len(built), len(fingerprints), len(resolved), made()) == (1, 1, 1, 1), \
        "the exact pass built a second method (or parsed, fingerprinted or resolved again)"
    assert exact.model is method.model and exact.weights_sha256 == method.weights_sha256
    assert exact.plan.fill == "exact" and (exact.plan.split, exact.plan.tail) == (method.plan.split, TAIL)
    assert exact.plan.chunk_size is None and exact.selector is None and exact.spec.method is None
    assert method.plan.fill == "identity" and method.selector is not None  # the arm itself is untouched
    for n in (3, 24):
        ids = prompt(n)
        assert exact.is_plain(n)
        got = exact.prefill(ids)
        assert torch.equal(got.logits, plain_prefill(model, ids).logits)  # the exact arm is the plain model
    assert exact.provenance()["fill"] == "exact" and exact.prefill_cost(24).prefill_macs == exact.prefill_cost(24).exact_macs


def test_model_args_parse_to_the_arm_the_method_runs(tiny_model_dir, tiny_model, made):
    """`--model_args` through the adapter's parser: one fill object, and the built method runs that arm's."""
    model, tok = tiny_model("llama")
    settings, _ = parse_ridgefill_args({"pretrained": str(tiny_model_dir("llama")), "fill": "nofill", "tail": "4"})
    assert made() == 1 and settings.arm.method.name == "nofill"
    method, exact = RidgeFillLM.build_method(SimpleNamespace(model=model, tokenizer=tok, settings=settings))
    assert made() == 1 and method.spec.method is settings.arm.method and exact.spec.method is None
    assert method.row_fill is not None and method.row_fill.absent
