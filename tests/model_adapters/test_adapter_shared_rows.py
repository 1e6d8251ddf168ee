"""`rf_eval.engine.shared_rows`: the stock model's rows of one prompt, computed by one arm and read back by the next
arm of the same process (`InProcessLauncher`), bit for bit what that arm computes alone."""

from __future__ import annotations

import pytest
import torch
from adapter_helpers import lm
from lm_eval.api.instance import Instance

from rf_eval.engine import shared_rows

CONTEXT = "the quick brown fox jumps over the lazy dog while the river runs past the old stone house"
REQUEST = Instance("token_logprobs", {}, (CONTEXT, " and then again"), 0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    with shared_rows.shared_rows() as rows:
        (own,) = lm(path, fill="exact").token_logprobs([REQUEST])  # the exact arm: its own rows, kept
    with shared_rows.shared_rows(rows):  # a later block with the same store (the launcher's next run)
        filled = lm(path, fill="identity", tail=4, reference="exact")
        forwards = count_forwards(monkeypatch, filled.model)
        (shared,) = filled.token_logprobs([REQUEST])
    assert rows.hits == 1 and len(forwards) == len(forwards_alone) - 1  # no reference forward
    assert shared == alone and shared["exact_logprobs"] == own["logprobs"]
    assert not shared_rows.active()  # outside a block nothing is kept or read


@pytest.mark.parametrize("change", ["one weight", "threads", "no room"])
def test_rows_are_read_back_only_under_the_same_weights_threads_and_room(tiny_model_dir, change):
    path = tiny_model_dir("llama")
    with shared_rows.shared_rows(shared_rows.SharedRows(0 if change == "no room" else shared_rows.DEFAULT_MAX_BYTES)) as rows:
        lm(path, fill="exact").token_logprobs([REQUEST])
        other = lm(path, fill="exact")
        if change == "one weight":  # one element, where a sampled fingerprint would not look
            with torch.no_grad():
                other.model.model.layers[-1].mlp.down_proj.weight.view(-1)[-7] += 1e-3
        if change == "threads":
            torch.set_num_threads(2)
        other.token_logprobs([REQUEST])
    assert rows.hits == 0


def test_a_model_whose_weights_are_not_in_memory_shares_nothing(tiny_model_dir, monkeypatch):
    """Weights on the `meta` device (offloaded) have no bytes to hash: no key, so nothing is kept or read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rf_eval.integrity.weights import weights_sha256

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir("llama")))
    with shared_rows.shared_rows():
        assert weights_sha256(meta) is None and shared_rows.model_key(meta, "cpu") is None
    scorer = lm(tiny_model_dir("llama"), fill="exact")
    monkeypatch.setattr(shared_rows, "model_key", lambda model, device: None)  # what such a model's key is
    with shared_rows.shared_rows() as rows:
        (out,) = scorer.token_logprobs([REQUEST])
    assert rows.entries == {} and len(out["logprobs"]) == len(out["tokens"]) > 0  # scored, nothing kept
