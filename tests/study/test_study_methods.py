"""A study arm of any prefill method (`rf_eval.methods`) is checked by its adapter before anything runs (#39 item 4):
`model: prefill` (a method without an adapter of its own) as `model: drop`, with no study code naming either."""

from __future__ import annotations

import pytest

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
