"""RULER lengths beyond the model's positions: refused before the weights load (lm_eval, the study plan) and
when the task is built against the running model's max_length, never left-truncated and scored as filled."""

from __future__ import annotations

import os

import pytest
from warm_start import run_argv

from rf_eval.errors import UserError
from rf_eval.harness import run_context
from rf_eval.tasks import data_needs
from rf_eval.tasks.positions import as_lengths, check_lengths_fit

TINY_POSITIONS = 8192  # rf_eval.testing.TINY_SHAPES["max_position_embeddings"]


@pytest.mark.parametrize("value, says", [
    ("4096", "max_seq_lengths='4096' is not a list of token counts"),
    ({"a": 1}, "is not a list of token counts"),
    ([4096, "abc"], "max_seq_lengths holds 'abc', not a positive number of tokens"),
    ([0], "holds 0, not a positive"),
    ([-5], "holds -5, not a positive"),
    ([True], "holds True"),
])
def test_bad_max_seq_lengths_are_named(value, says):
    with pytest.raises(UserError, match=says.replace("(", r"\(")):
        as_lengths(value)


def test_good_max_seq_lengths_pass():
    assert as_lengths([1024, 2048]) == [1024, 2048] and as_lengths(4096) == [4096]


@pytest.mark.parametrize("metadata, says", [
    ({"max_seq_lengths": [16384]}, f"max_seq_lengths 16384 exceeds the model's {TINY_POSITIONS:,} positions"),
    ({"max_seq_lengths": [1024, 9000, 16384]}, "max_seq_lengths 9000, 16384 exceed the model's"),
    ({"max_seq_lengths": [2048], "max_length": 1024}, "max_seq_lengths 2048 exceeds the model's 1,024 positions "
                                                       "(max_length=1024)"),
])
def test_preflight_refuses_lengths_beyond_the_config_positions(tiny_llama, metadata, says):
    with pytest.raises(UserError, match=says.replace("(", r"\(").replace(")", r"\)")) as err:
        data_needs.preflight(["niah_single_1_filled", "ruler_second_question"], {"pretrained": tiny_llama, **metadata})
    assert "niah_single_1_filled:" in str(err.value) and "ruler_second_question:" in str(err.value)


def test_preflight_passes_lengths_within_positions_and_other_tasks(tiny_llama):
    assert check_lengths_fit(["niah_single_1_filled"], {"pretrained": tiny_llama, "max_seq_lengths": [8192]}) == []
    data_needs.preflight(["hellaswag", "keytoken_nll"], {"pretrained": tiny_llama, "max_seq_lengths": [16384]})


def test_the_task_refuses_lengths_beyond_the_running_models_max_length(tiny_llama, th):
    """Without max_seq_lengths in the preflight's view (the demo's defaults), the task itself checks the
    running adapter's max_length before it builds a sample."""

    class Running:  # stands in for the adapter; run_context keeps a weak reference to it
        pass

    model = Running()
    run_context.publish(model, {"max_length": 1000, "tokenizer": tiny_llama})
    try:
        with pytest.raises(UserError, match="max_seq_lengths 1024 exceeds the model's 1,000 positions"):
            th.load_task("niah_single_1_filled", {"pretrained": tiny_llama, "max_seq_lengths": [1024]})
    finally:
        run_context.clear()


def test_lm_eval_exits_2_in_one_line_before_the_weights_load(tiny_llama, th, tmp_path):
    cmd = th.lm_eval_argv() + ["--model", "ridgefill", "--model_args", f"pretrained={tiny_llama},fill=exact",
                               "--tasks", "niah_single_1_filled", "--metadata", '{"max_seq_lengths": [16384]}',
                               "--output_path", str(tmp_path)]
    done = run_argv(cmd, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "max_seq_lengths 16384 exceeds the model's 8,192 positions" in done.stderr
    assert "Loading checkpoint" not in done.stderr and "Building contexts" not in done.stderr
