"""The request rules every shell shares (`rf_eval.methods.requests`): prompt checks, the generation prefill,
sampling seeds."""

from __future__ import annotations

import pytest
import torch

from rf_eval.methods.base import Method
from rf_eval.methods.requests import generation_cache, sampling_seed
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.method import RidgeFill


@pytest.mark.parametrize(
    "bad, message",
    [
        ([[1, 2, 3]], "must be a 1 x N torch.LongTensor, got list"),
        (torch.tensor([1, 2, 3]), "must be a 1 x N tensor, got shape (3,)"),
        (torch.ones(2, 3, dtype=torch.long), "must be a 1 x N tensor, got shape (2, 3)"),
        (torch.ones(1, 3), "must hold integer token ids, got dtype torch.float32"),
        (torch.zeros(1, 0, dtype=torch.long), "input_ids is empty"),
        (torch.tensor([[5, 100000]]), "token id 100000 is outside the model's vocabulary 0..258"),
        (torch.tensor([[-1, 5]]), "token id -1 is outside the model's vocabulary"),
    ],
)
def test_prefill_refuses_a_bad_prompt_saying_what_it_got(tiny_model, bad, message):
    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, split=3, tail=4, fill="identity")
    with pytest.raises(ValueError) as err:
        rf.prefill(bad)
    assert message in str(err.value)


def test_generation_cache_is_the_prompt_minus_its_last_token_with_the_tail_shortened(tiny_model):
    model, tok = tiny_model("qwen3")
    rf = RidgeFill(model, tok, split=3, tail=4, fill="identity")
    assert isinstance(rf, Method)
    prompt = torch.randint(0, 250, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    got = generation_cache(rf, prompt, rf.plan(20))
    by_hand = prefill_arm(model, tok, rf.arm, torch.tensor([prompt[:-1]]),
                          rf.arm.plan.__class__(split=3, tail=3, fill="identity"), rf.arm.fill_obj.row_fill(rf.fill_fn))
    assert got.prompt_length == 19 and torch.equal(got.exact_rows, by_hand.exact_rows)
    assert torch.equal(got.logits, by_hand.logits)
    assert generation_cache(rf, prompt[:4], rf.plan(4)) is None  # within the tail: plain, `generate` prefills it
    assert generation_cache(rf, prompt[:1], rf.plan(1)) is None
    exact = RidgeFill(model, tok, fill="exact")
    assert generation_cache(exact, prompt, exact.plan(20)) is None


def test_sampling_seed_depends_on_seed_and_prompt_only():
    assert sampling_seed(3, [1, 2]) == sampling_seed(3, [1, 2])
    assert len({sampling_seed(3, [1, 2]), sampling_seed(4, [1, 2]), sampling_seed(3, [2, 1])}) == 3
