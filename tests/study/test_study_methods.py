"""A study arm of any prefill method (`rf_eval.methods`) is checked by the adapter before anything runs (#39 item 4):
`model: prefill` as `model: drop` (one adapter, two names), with no study code naming a method; `study plan`
previews each arm's cost by its method's own rule."""

from __future__ import annotations

import dataclasses

import pytest

from rf_eval.methods import Method, register_method, unregister_method
from rf_eval.study.launchers import make_launcher
from rf_eval.study.plan import plan_text
from rf_eval.study.preflight import check_arm_args
from rf_eval.study.runner import model_args
from rf_eval.study.spec import ADAPTERS
from rf_eval.study.study_file import StudyArm, StudyError, load_study

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
    ("prefill", "method: gemfilter, keep_share: 2", "keep_share=2"),
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
    """An rf-eval arm (checked, not passed over as an API model's) whose adapter reads the study's arguments as
    its method's arm: the check passes."""
    from rf_eval.drop.gemfilter import GemFilter
    from rf_eval.model_adapters.config import preflight

    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(model=tiny_model_dir("llama"), adapter="drop", args="method: gemfilter, keep: 4"))
    study = load_study(path)
    arm = study.arms["other"]
    assert arm.model in ADAPTERS
    spec = preflight(model_args(study, arm, None), arm.model)  # what the check asks the adapter
    assert type(spec) is GemFilter.Arm and spec.keep == 4
    assert check_arm_args(study, arm) is None  # a bad arm: a StudyError naming it (the test above)


@dataclasses.dataclass(frozen=True)
class KeepArm:
    keep: int = 8


class Unbuilt(Method):
    """A throwaway method's protocol, never run: reading or previewing a study builds no method."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a study's reading or preview builds no method")

    def is_plain(self, n):
        raise AssertionError

    def prefill(self, input_ids, *, for_generation=False, held_back=0, plan=None):
        raise AssertionError

    def prefill_cost(self, n, result=None, plan=None):
        raise AssertionError


class KeepPlanned(Unbuilt):
    """A throwaway method that previews its own cost: `keep` rows of n."""

    name, Arm = "keep_planned", KeepArm

    @classmethod
    def preview_costs(cls, config, arm, lengths, *, maps_split):
        return {n: (arm.keep / n, f"keep {arm.keep}") for n in lengths}


def test_the_plan_previews_each_methods_cost_by_its_own_rule(tmp_path, tiny_model_dir, monkeypatch):
    """`rf-eval study plan` asks each arm's method (`Method.preview_costs`): a registered method's own preview
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


@dataclasses.dataclass(frozen=True)
class ShareArm:
    share: float | None = None
    budget: float | None = None
    mode: str | None = None

    def __post_init__(self):
        if self.share is not None and self.budget is not None:
            raise ValueError("give share or budget, not both")


class ShareStudy(Unbuilt):
    """A throwaway method that declares its study rules: `mode` is required, a budget sets `share`, and an arm
    with mode=mapped reads the study's maps."""

    name, Arm, budget_sets = "share_study", ShareArm, ("share",)

    @classmethod
    def missing_fields(cls, fields):
        return {} if "mode" in fields else {"mode": "plain | mapped"}

    @classmethod
    def reads_study_maps(cls, model_args):
        return model_args.get("mode") == "mapped"


def test_the_study_reads_a_methods_own_rules_for_required_fields_budgets_and_maps(tmp_path, tiny_model_dir):
    """The study file and runner name no method: a registered method's required fields, the fields a budget
    sets instead and whether it reads the study's maps are its own declarations (`Method`)."""
    model = tiny_model_dir("llama")
    study_text = STUDY.format(model=model, adapter="prefill", args="method: share_study, share: 0.5, mode: mapped")
    register_method(ShareStudy)
    try:
        path = tmp_path / "study.yaml"
        path.write_text(study_text.replace("arms:", "maps: maps/\nbudgets: [0.3, 0.6]\narms:"))
        (tmp_path / "maps").mkdir()
        study = load_study(path)
        assert {"other@0.3", "other@0.6"} <= set(study.arms) and "other" not in study.arms
        assert study.arms["other@0.3"].args == {"method": "share_study", "mode": "mapped", "budget": 0.3}
        assert model_args(study, study.arms["other@0.3"], str(tmp_path / "maps"))["maps"] == str(tmp_path / "maps")
        plain = StudyArm("plain", "prefill", {"method": "share_study", "mode": "plain"})
        assert "maps" not in model_args(study, plain, str(tmp_path / "maps"))
        path.write_text(study_text.replace(", mode: mapped", ""))
        with pytest.raises(StudyError, match=r"arms.other: a prefill arm needs args.mode \(plain \| mapped\) \(line"):
            load_study(path)
    finally:
        unregister_method("share_study")


def test_a_study_default_an_arms_method_does_not_take_stays_with_the_arms_that_do(tmp_path, tiny_model_dir):
    """`model.args: {tail: 64}` is the fills' tail: the preset arm (whose preset sets the tail) and the dropper
    (which has none) run without it and pass their checks; the fill arm keeps it; an arm's own key is never
    dropped (issue #54, item 1)."""
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(model=tiny_model_dir("llama"), adapter="drop", args="method: gemfilter, keep: 4")
                    .replace("args: {dtype: float32, device: cpu}", "args: {dtype: float32, device: cpu, tail: 64}")
                    .replace("reference: exact", "  fast: {args: {preset: fastkv}}\nreference: exact"))
    study = load_study(path)
    args = {name: model_args(study, arm, None) for name, arm in study.arms.items()}
    assert args["exact"]["tail"] == 64 and args["exact"]["dtype"] == "float32"
    assert "tail" not in args["fast"] and "tail" not in args["other"] and args["other"]["dtype"] == "float32"
    for name in ("exact", "fast", "other"):
        assert check_arm_args(study, study.arms[name]) is None
    path.write_text(path.read_text().replace("  fast: {args: {preset: fastkv}}", "  mine: {args: {preset: fastkv, tail: 8}}"))
    with pytest.raises(StudyError, match=r"arms\.mine: preset=fastkv sets fill, tail and split; leave out tail \(line"):
        load_study(path)  # the arm's own tail is refused, as given, naming the arm and its line
