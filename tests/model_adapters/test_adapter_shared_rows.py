"""`rf_eval.plain_rows`: the stock model's rows of one prompt, computed by one arm and read back by the next
arm of the same process (`InProcessLauncher`), bit for bit what that arm computes alone."""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance

from rf_eval import plain_rows
from rf_eval.model_adapters.ridgefill import RidgeFillLM

CONTEXT = "the quick brown fox jumps over the lazy dog while the river runs past the old stone house"
REQUEST = Instance("token_logprobs", {}, (CONTEXT, " and then again"), 0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lm(model_dir: str, **args) -> RidgeFillLM:
    return RidgeFillLM.create_from_arg_obj({"pretrained": model_dir, "device": "cpu", **args})


def count_forwards(monkeypatch, model) -> list[int]:
    calls: list[int] = []
    original = model.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted)
    return calls


def test_the_exact_arms_rows_are_the_filled_arms_reference_bit_for_bit(tiny_model_dir, monkeypatch):
    path = tiny_model_dir("llama")
    filled = lm(path, fill="identity", tail=4, reference="exact")
    forwards_alone = count_forwards(monkeypatch, filled.model)
    (alone,) = filled.token_logprobs([REQUEST])  # nothing shared: the arm's pass over its cache, the reference
    with plain_rows.shared_rows() as rows:
        (own,) = lm(path, fill="exact").token_logprobs([REQUEST])  # the exact arm: its own rows, kept
    with plain_rows.shared_rows(rows):  # a later block with the same store (the launcher's next run)
        filled = lm(path, fill="identity", tail=4, reference="exact")
        forwards = count_forwards(monkeypatch, filled.model)
        (shared,) = filled.token_logprobs([REQUEST])
    assert rows.hits == 1 and len(forwards) == len(forwards_alone) - 1  # no reference forward
    assert shared == alone and shared["exact_logprobs"] == own["logprobs"]
    assert not plain_rows.active()  # outside a block nothing is kept or read


@pytest.mark.parametrize("change", ["one weight", "threads", "no room"])
def test_rows_are_read_back_only_under_the_same_weights_threads_and_room(tiny_model_dir, change):
    path = tiny_model_dir("llama")
    with plain_rows.shared_rows(plain_rows.SharedRows(0 if change == "no room" else plain_rows.DEFAULT_MAX_BYTES)) as rows:
        lm(path, fill="exact").token_logprobs([REQUEST])
        other = lm(path, fill="exact")
        if change == "one weight":  # one element, where a sampled fingerprint would not look
            with torch.no_grad():
                other.model.model.layers[-1].mlp.down_proj.weight.view(-1)[-7] += 1e-3
        if change == "threads":
            torch.set_num_threads(2)
        other.token_logprobs([REQUEST])
    assert rows.hits == 0
