"""A study arm of any prefill method (`rf_eval.methods`) is checked by its adapter before anything runs (#39 item 4):
`model: prefill` (a method without an adapter of its own) as `model: drop`, with no study code naming either;
`study plan` previews each arm's cost by its method's own rule."""

from __future__ import annotations

import dataclasses

import pytest

from rf_eval.methods import Method, register_method, unregister_method
from rf_eval.study.launchers import make_launcher
from rf_eval.study.plan import plan_text
from rf_eval.study.preflight import check_arm_args
from rf_eval.study.runner import model_args
from rf_eval.study.study_file import ADAPTERS, StudyError, load_study

STUDY = """\
model:
  pretrained: {model}
  args: {{dtype: float32, device: cpu}}
tasks: [keytoken_nll]
arms:
  exact: {{args: {{fill: exact}}}}
  other: {{model: {adapter}, args: {{{args}}}}}
reference: exact
"""


@pytest.mark.parametrize("adapter, args, says", [
    ("prefill", "method: ridgefil", "'ridgefil' is not a prefill method"),
    ("prefill", "method: gemfilter", "runs as --model drop"),
    ("drop", "method: gemfilter, keep: 0", "keep=0"),
])
def test_a_method_arm_is_refused_by_its_adapter_before_anything_runs(adapter, args, says, tmp_path, tiny_model_dir):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(model=tiny_model_dir("llama"), adapter=adapter, args=args))
    study = load_study(path)
    assert adapter in ADAPTERS
    arm = study.arms["other"]
    assert model_args(study, arm, None)["pretrained"] == tiny_model_dir("llama")  # an rf-eval arm: the study's model
    with pytest.raises(StudyError, match=f"arms.other: .*{says}"):
        check_arm_args(study, arm)


def test_a_good_method_arm_passes(tmp_path, tiny_model_dir):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(model=tiny_model_dir("llama"), adapter="drop", args="method: gemfilter, keep: 4"))
    study = load_study(path)
    check_arm_args(study, study.arms["other"])


@dataclasses.dataclass(frozen=True)
class KeepArm:
    method: str = "keep_planned"
    keep: int = 8


class KeepPlanned(Method):
    """A throwaway method that previews its own cost: `keep` rows of n."""

    name, Arm = "keep_planned", KeepArm

    @classmethod
    def build(cls, model, tokenizer, arm, **parts):
        raise AssertionError("the plan builds no method")

    @classmethod
    def planned_costs(cls, config, arm, lengths, *, maps_split):
        return {n: (arm.keep / n, f"keep {arm.keep}") for n in lengths}


def test_the_plan_previews_each_methods_cost_by_its_own_rule(tmp_path, tiny_model_dir, monkeypatch):
    """`rf-eval study plan` asks each arm's method (`Method.planned_costs`): a registered method's own preview
    with its arm's setting, RidgeFill's from the MAC model, and none for a method that previews nothing."""
    register_method(KeepPlanned)
    try:
        path = tmp_path / "study.yaml"
        path.write_text(STUDY.format(model=tiny_model_dir("llama"), adapter="prefill",
                                     args="method: keep_planned, keep: 16")
                        .replace("arms:", "lengths: [64, 128]\narms:")
                        .replace("reference:", "  identity: {args: {fill: identity, split: 3, tail: 8}}\n"
                                 "  gemfilter: {model: drop, args: {method: gemfilter, keep: 4}}\nreference:"))
        study = load_study(path)
        text = plan_text(study, tmp_path / "out", make_launcher("local", tmp_path / "out"))
    finally:
        unregister_method("keep_planned")
    arms = {part.split("]", 1)[0]: part for part in text.split("\n[")[1:]}
    assert "MAC cost / exact: N=64: 0.250 (keep 16), N=128: 0.125 (keep 16)" in arms["other"]
    assert "MAC cost / exact: N=64: " in arms["identity"] and "(" not in arms["identity"].split("MAC cost")[1]
    assert "MAC cost / exact: N=64: 1.000, N=128: 1.000" in arms["exact"]
    assert "MAC cost" not in arms["gemfilter"]  # a method with no preview: costed per item when it runs
