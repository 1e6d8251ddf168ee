"""An arm is one object, bound once (issue #39 item 1, #53): its fill name becomes a fill object once per arm,
never per prompt; the engine gets the bound strategy, not a name; the arm is resolved against the model once,
before the weights load; the exact reference is the exact method over the loaded model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rf_eval.engine import plain_prefill
from rf_eval.fills.base import Fill
from rf_eval.methods.exact import Exact
from rf_eval.methods.requests import generation_cache
from rf_eval.model_adapters.config import parse_model_args
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.ridgefill import arm as arm_module
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.method import RidgeFill

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

    monkeypatch.setattr(Fill, "__init__", counting_init)
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
    assert rf.arm.fill_obj is arm.fill_obj and rf.arm is arm  # resolved once already: kept as it is
    for i, n in enumerate(LENGTHS):
        ids = prompt(n, i)
        plan = rf.plan(n)
        result = rf.prefill(ids, plan=plan)
        rf.prefill_cost(n, result, plan)
        rf.speedup_ceilings(n, plan)
        generation_cache(rf, ids[0].tolist(), plan)
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


def test_the_arm_is_resolved_once_before_the_weights_and_the_reference_is_the_exact_method(
        tiny_model_dir, tiny_model, made, monkeypatch):
    model, tok = tiny_model("llama")
    resolved = []
    real_resolve = RidgeFillArm.resolve
    monkeypatch.setattr(RidgeFillArm, "resolve", lambda self, *a, **k: (resolved.append(1),
                                                                         real_resolve(self, *a, **k))[1])
    settings, _ = parse_model_args({"pretrained": str(tiny_model_dir("llama")), "fill": "identity",
                                    "tail": str(TAIL), "chunk_size": "5",
                                    "selector": "attention(share=0.25;layers=0|1)"}, "ridgefill")
    assert (len(resolved), made()) == (1, 1)
    method = PrefillLM.build_method(SimpleNamespace(model=model, tokenizer=tok), settings)
    assert (len(resolved), made()) == (1, 1), "the loaded weights resolved the arm again (or built its fill)"
    assert method.arm is settings.arm and method.arm.fill_obj is settings.arm.fill_obj
    exact = Exact(model, tok)
    for n in (3, 24):
        ids = prompt(n)
        assert exact.plan(n).plain and exact.is_plain(n)
        assert torch.equal(exact.prefill(ids).logits, plain_prefill(model, ids).logits)  # the stock model
    assert exact.provenance()["method"] == "exact"
    assert exact.prefill_cost(24).prefill_macs == exact.prefill_cost(24).exact_macs


def test_model_args_parse_to_the_arm_the_method_runs(tiny_model_dir, tiny_model, made):
    """`--model_args` through the adapter's parser: one fill object, and the built method runs that arm's."""
    model, tok = tiny_model("llama")
    settings, _ = parse_model_args({"pretrained": str(tiny_model_dir("llama")), "fill": "nofill", "tail": "4"},
                                   "ridgefill")
    assert made() == 1 and settings.arm.fill_obj.name == "nofill"
    method = PrefillLM.build_method(SimpleNamespace(model=model, tokenizer=tok), settings)
    assert made() == 1 and method.arm.fill_obj is settings.arm.fill_obj
    assert method.row_fill is not None and method.row_fill.absent
