"""Arm presets (#25 item 4): POP at its published configuration is one arm setting, `preset=pop`."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from rf_eval.cli.check_equivalence import compare
from rf_eval.cost.mac_model import prefill_macs
from rf_eval.fields import ArmError
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.method import RidgeFill


@pytest.mark.parametrize("layers, split", [(32, 22), (36, 24), (6, 4)])
def test_pop_is_the_identity_fill_from_the_last_third_with_a_one_token_tail(layers, split):
    """RidgeFill paper section 6.4: "the identity fill from layer L - floor(L/3) with a one-token tail"
    (split 24 on the 36-layer Qwen3-8B)."""
    arm = RidgeFillArm.from_fields({"preset": "pop"}).resolve(LlamaConfig(num_hidden_layers=layers))
    assert (arm.fill, arm.split, arm.tail) == ("identity", split, 1)
    assert arm.describe()["preset"] == "pop"


@pytest.mark.parametrize("fields, message", [
    ({"preset": "pop", "tail": 8}, "preset=pop sets fill, tail and split; leave out tail"),
    ({"preset": "pop", "split": 3}, "leave out split"),
    ({"preset": "pop", "fill": "ridge"}, "leave out fill"),
    ({"preset": "swift"}, "preset='swift' is not valid; valid presets: fastkv, pop"),
])  # fmt: skip
def test_a_preset_with_its_own_fill_tail_or_split_is_refused(fields, message):
    with pytest.raises(ArmError, match=message):
        RidgeFillArm.from_fields(fields)


def test_a_split_that_contradicts_the_preset_is_refused_when_the_arm_meets_the_model():
    with pytest.raises(ArmError, match="preset=pop splits this 32-layer model at 22, not 12"):
        RidgeFillArm(preset="pop", split=12).resolve(LlamaConfig(num_hidden_layers=32))


def test_the_pop_arm_is_the_identity_arm_it_names(tiny_model):
    model, tok = tiny_model("llama")
    ids = torch.randint(0, 250, (1, 30), generator=torch.Generator().manual_seed(5))
    pop = RidgeFill(model, tok, preset="pop")
    spelled = RidgeFill(model, tok, fill="identity", split=4, tail=1)
    assert pop.arm.plan == spelled.arm.plan and compare(pop.prefill(ids), spelled.prefill(ids)) is None
    assert pop.provenance()["preset"] == "pop"


def test_the_study_plan_costs_the_preset_at_its_own_split_and_tail(tmp_path):
    from rf_eval.study.plan import arm_preview
    from rf_eval.study.study_file import StudyArm

    config = LlamaConfig(num_hidden_layers=32, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    config.save_pretrained(tmp_path)

    class Study:
        pretrained, model_args, lengths = str(tmp_path), {}, [1024]

    costs = arm_preview(Study, StudyArm("pop", "ridgefill", {"preset": "pop"}))
    want = prefill_macs(config, 1024, split=22, tail=1, fill="identity") / prefill_macs(config, 1024)
    assert costs.keys() == {1024} and costs[1024] == (pytest.approx(want, rel=1e-12), None) and want < 0.75


def test_the_study_plan_costs_a_ridge_arm_at_its_fit_blocks_split_before_the_maps_exist(tmp_path):
    """The arm spec's split rule (`RidgeFillArm.split_for`) with the `fit:` block's split, not L/2."""
    from rf_eval.study.plan import arm_preview
    from rf_eval.study.study_file import StudyArm

    config = LlamaConfig(num_hidden_layers=32, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    config.save_pretrained(tmp_path)

    class Study:
        pretrained, model_args, lengths, maps = str(tmp_path), {}, [1024], None
        fit = {"split": 6, "calibration": ["cal.jsonl"]}

    costs = arm_preview(Study, StudyArm("ridge", "ridgefill", {"fill": "ridge", "tail": 8}))
    want = prefill_macs(config, 1024, split=6, tail=8, fill="ridge") / prefill_macs(config, 1024)
    assert costs.keys() == {1024} and costs[1024] == (pytest.approx(want, rel=1e-12), None)
