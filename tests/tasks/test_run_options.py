"""lm_eval options that would fail only after the model loaded are refused before it loads, in one line."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from warm_start import run_argv

from rf_eval.errors import UserError
from rf_eval.tasks.data_needs import check_run_options


def no_template(tiny_llama, folder):
    shutil.copytree(tiny_llama, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("limit, says", [(0, "--limit 0 runs no sample"), (0.0, "--limit 0.0"), (-3, "--limit -3")])
def test_a_limit_of_no_samples_is_refused(limit, says):
    with pytest.raises(UserError, match=says):
        check_run_options({"limit": limit})


def test_a_chat_template_the_tokenizer_lacks_is_refused(tiny_llama, tmp_path):
    plain = no_template(tiny_llama, tmp_path / "plain")
    with pytest.raises(UserError, match=f"--apply_chat_template: the tokenizer of {plain} has no chat template"):
        check_run_options({"apply_chat_template": True, "model_args": f"pretrained={plain}"})
    check_run_options({"apply_chat_template": True, "model_args": {"pretrained": tiny_llama}})  # has one
    check_run_options({"apply_chat_template": False, "model_args": {"pretrained": plain}, "limit": 2})


def test_a_model_folder_without_tokenizer_files_is_refused_before_the_weights(tiny_llama, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rf_eval.model_adapters.config import ModelArgsError, parse_model_args
    folder = tmp_path / "weights_only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tiny_llama, name), folder / name)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ModelArgsError, match="its tokenizer does not load .*give tokenizer=<a folder or hub id"):
        parse_model_args({"pretrained": str(folder), "fill": "exact"}, "ridgefill")
    settings, _hf = parse_model_args({"pretrained": str(folder), "fill": "exact", "tokenizer": tiny_llama}, "ridgefill")
    assert settings.pretrained == str(folder)


def test_lm_eval_refuses_both_in_one_line(tiny_llama, th, tmp_path):
    plain = no_template(tiny_llama, tmp_path / "plain")
    for extra, says in [(["--limit", "0"], "--limit 0.0 runs no sample"),
                        (["--apply_chat_template"], "has no chat template")]:
        cmd = th.lm_eval_argv() + ["--model", "ridgefill", "--model_args", f"pretrained={plain},fill=exact,tail=256",
                                   "--tasks", "niah_single_1_filled", "--metadata", '{"max_seq_lengths": [512]}',
                                   "--output_path", str(tmp_path / "out"), *extra]
        done = run_argv(cmd, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and says in done.stderr
        assert [line for line in done.stderr.splitlines() if line.startswith("rf-eval:")] != []


@pytest.mark.parametrize("tasks, says", [
    (["decode_agreement"], "decode_agreement sends `token_logprobs` requests, which --model hf does not serve"),
    (["hellaswag", "keytoken_nll"], "keytoken_nll sends `token_logprobs` requests"),
    (["ruler_second_question"], "ruler_second_question sends `multiturn_generate` requests"),
])
def test_a_task_another_model_cannot_serve_is_refused_before_it_loads_naming_that_task(tasks, says):
    """`--model hf --tasks decode_agreement` is refused in one line naming decode_agreement (not another task,
    not a traceback from inside the evaluator) before the model is built (issue #54, item 5)."""
    import types

    from rf_eval.tasks.data_needs import check_before_model

    built = []
    evaluator = types.SimpleNamespace(simple_evaluate=lambda model=None, model_args=None, tasks=None: built.append(1))
    check_before_model(evaluator)
    with pytest.raises(UserError, match=says.replace("`", ".")) as err:
        evaluator.simple_evaluate(model="hf", model_args="pretrained=x", tasks=tasks)
    assert built == [] and "run it with --model ridgefill, rarecache, drop or prefill" in str(err.value)
    if "ruler_second_question" not in tasks:  # (that one also needs downloaded data, which this machine lacks)
        evaluator.simple_evaluate(model="ridgefill", tasks=tasks)  # rf-eval's models serve them
        assert built == [1]
