"""No arm runs on a tensor its checkpoint lacked (issue #41, item 4): transformers initialises such a tensor at
random and only logs it; rf-eval refuses the arm that would read it, naming the tensor."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rf_eval.fields import ArmError
from rf_eval.fills.loading_report import missing_keys, recording_missing_keys
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.testing import make_tiny_model, make_tiny_swiftkv


def _without(folder, *names: str):
    """The checkpoint in `folder` with the tensors `names` taken out."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    for name in names:
        del tensors[name]
    save_file(tensors, str(path), metadata={"format": "pt"})
    return folder


def test_missing_keys_are_recorded_only_while_recording(tmp_path):
    whole = make_tiny_model("llama", tmp_path / "whole")
    holed = _without(make_tiny_model("llama", tmp_path / "holed"), "model.layers.4.self_attn.k_proj.weight")
    with recording_missing_keys():
        assert missing_keys(AutoModelForCausalLM.from_pretrained(whole)) == frozenset()
        assert missing_keys(AutoModelForCausalLM.from_pretrained(holed)) == {"model.layers.4.self_attn.k_proj.weight"}
    assert missing_keys(AutoModelForCausalLM.from_pretrained(holed)) is None  # not recorded: unknown


@pytest.mark.parametrize("fill", ["exact", "identity"])
def test_an_arm_on_a_checkpoint_missing_a_tensor_is_refused_by_name(tmp_path, fill):
    holed = _without(make_tiny_model("llama", tmp_path / "holed"), "model.layers.4.self_attn.k_proj.weight",
                     "model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ArmError, match=r"the model's checkpoint lacks 2 tensor\(s\) that .* reads "
                                       r"\(model.layers.1.mlp.up_proj.weight, model.layers.4.self_attn.k_proj.weight\)"):
        RidgeFill.from_pretrained(holed, fill=fill, tail=4, device="cpu")
    RidgeFill.from_pretrained(make_tiny_model("llama", tmp_path / "whole"), fill=fill, tail=4, device="cpu")


def test_swiftkv_tensors_missing_refuse_the_swiftkv_fills_only(tmp_path):
    """A config that says llama_swiftkv over weights without SwiftKV's tensors: the SwiftKV fills would run on
    random projections and are refused; the exact and identity arms read the base model and run."""
    folder = make_tiny_swiftkv(tmp_path / "swiftkv", num_key_value_layers=3)
    names = [n for n in load_file(str(folder / "model.safetensors")) if "_swiftkv" in n]
    _without(folder, *names)
    for fill in ("swiftkv", "swiftkv_released"):
        with pytest.raises(ArmError, match=rf"lacks {len(names)} tensor\(s\) that fill={fill} reads .*_swiftkv"):
            RidgeFill.from_pretrained(folder, fill=fill, tail=2, device="cpu")
    for fill in ("exact", "identity"):
        RidgeFill.from_pretrained(folder, fill=fill, tail=2, split=3, device="cpu")


def test_a_config_naming_another_architecture_over_the_weights_is_refused(tmp_path):
    """config.json says qwen2 over a Llama checkpoint: transformers builds Qwen2's q/k/v biases at random (the
    weights hold none) and `hf` runs on them; the arm refuses, naming them."""
    import json

    folder = make_tiny_model("llama", tmp_path / "relabelled")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArmError, match=r"checkpoint lacks \d+ tensor\(s\) that its forward reads "
                                       r"\(model.layers.0.self_attn.k_proj.bias"):
        RidgeFill.from_pretrained(folder, fill="exact", tail=4, device="cpu")
