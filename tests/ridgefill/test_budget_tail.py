"""A budget that turns the tail: the tail given beside it bounds the scored filled region, and results say so.

README, "What an arm saves": a `tail` given beside a tail budget is not the tail that runs; provenance records
it as `scored_tail` and `tail: null`, each sample's `knob_value` the tail that ran.
"""

from __future__ import annotations

from transformers import AutoConfig

from rf_eval.demo.model import demo_model_dir
from rf_eval.demo.study import ridge_budget, settings
from rf_eval.ridgefill.arm_spec import RidgeFillArm


def test_a_tail_budget_records_the_given_tail_as_the_scored_edge_not_the_tail_that_runs():
    config = AutoConfig.from_pretrained(demo_model_dir())
    s = settings(quick=True)
    budget = ridge_budget(config, s)
    arm = RidgeFillArm(fill="identity", split=18, tail=s.tail, budget=budget).resolve(config)
    ran = arm.plan_at(s.lengths[0])[0].tail
    # the quick demo's identity@F spends nothing on maps, so F (ridge's fraction at tail 256) buys it more rows
    assert ran > s.tail
    described = arm.describe()
    assert described["tail"] is None and described["scored_tail"] == s.tail and described["knob"] == "tail"


def test_an_arm_without_a_budget_or_with_another_knob_records_its_tail():
    config = AutoConfig.from_pretrained(demo_model_dir())
    plain = RidgeFillArm(fill="identity", split=18, tail=64).resolve(config)
    rows = RidgeFillArm(fill="identity", split=18, tail=64, selector="attention", budget=0.9).resolve(config)
    assert plain.describe()["tail"] == 64 and "scored_tail" not in plain.describe()
    assert rows.describe()["tail"] == 64 and rows.describe()["knob"] == "rows"
