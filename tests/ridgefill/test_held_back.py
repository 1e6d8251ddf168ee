"""The tail means exact rows of the whole prompt on every path (issue #42, item 1): a generation prefill holds
back the last token, so it keeps tail - 1 exact tail rows, none at tail 1 (POP's one-token tail, RidgeFill
paper sections 6.4 and 7)."""

from __future__ import annotations

import pytest
import torch

from rf_eval.methods.requests import generate, generation_prompt
from rf_eval.ridgefill.method import RidgeFill

N = 80


def _ids(seed: int = 5) -> torch.Tensor:
    return torch.randint(3, 250, (1, N), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tail", [1, 2, 64])
@pytest.mark.parametrize("selector", [None, "random(count=8;seed=3)", "longer_tail(count=8)"])
def test_the_generation_prefill_plus_the_decoded_token_is_the_whole_prompts_exact_row_set(
        tiny_model, tail, selector):
    model, tok = tiny_model("llama")
    arm = {"fill": "identity", "split": 3, "tail": tail, **({"selector": selector} if selector else {})}
    rf = RidgeFill(model, tok, **arm)
    ids = _ids()
    whole = rf.prefill(ids)
    given = rf.prefill(torch.tensor([generation_prompt(rf, ids[0].tolist())]), for_generation=True)
    assert given.prompt_length == N - 1
    if rf.reads_whole_prompt:  # an arm with a selector: the whole prompt ran, its last row given back (#55 item 2)
        assert given.exact_rows.tolist() == whole.exact_rows.tolist() and given.plan == whole.plan
    else:
        assert [*given.exact_rows.tolist(), N - 1] == whole.exact_rows.tolist()
        assert given.plan.tail == whole.plan.tail - 1 >= tail - 1
    held, full = rf.prefill_cost(N, given), rf.prefill_cost(N, whole)
    assert (held.exact_rows, held.prefill_macs) == (full.exact_rows, full.prefill_macs)
    assert full.exact_rows == whole.exact_rows.numel()


@pytest.mark.parametrize("fill", ["identity", "nofill"])
def test_pop_generation_runs_no_late_exact_row_and_its_decoded_token_has_the_whole_prompts_logits(tiny_model, fill):
    """`preset=pop` (and nofill at tail 1): the held-back prompt's late layers run no exact row; decoding its
    last token over that cache gives the whole-prompt prefill's last-row logits (within fp32 rounding: the
    decode attends with the stock kernel, the whole prompt with the engine's), and the caches hold the same
    late-layer keys."""
    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, preset="pop") if fill == "identity" else RidgeFill(model, tok, fill="nofill", tail=1)
    ids = _ids(7)
    whole = rf.prefill(ids)
    given = rf.prefill(ids[:, :-1], for_generation=True)
    assert given.exact_rows.numel() == 0 and given.logits.shape == (1, 0)
    assert rf.prefill_cost(N, given).exact_rows == 1  # the decoded token, charged as the one tail row
    decoded = rf.extend(given, ids[:, -1:])[0, -1]
    assert torch.allclose(decoded, whole.logits[0], atol=1e-5, rtol=1e-5)
    assert decoded.argmax() == whole.logits[0].argmax()
    for layer in range(rf.arm.split, model.config.num_hidden_layers):
        a, b = given.cache.layers[layer].keys, whole.cache.layers[layer].keys
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_pop_generates_what_greedy_decoding_from_the_whole_prompt_gives(tiny_model):
    """Through `generate` (lm-eval's generate_until path): the first token is the whole-prompt prefill's argmax."""
    model, tok = tiny_model("llama")
    rf = RidgeFill(model, tok, preset="pop")
    ids = _ids(11)
    out = generate(rf, ids, max_new_tokens=1, do_sample=False)
    assert out.shape == (1, N + 1) and torch.equal(out[:, :N], ids)
    assert int(out[0, -1]) == int(rf.prefill(ids).logits[0].argmax())


@pytest.mark.parametrize(("family", "fill"), [("qwen3_5", "identity"), ("qwen3_5", "nofill"), ("gemma3", "identity"),
                                            ("qwen3_moe", "identity"), ("qwen3_moe", "nofill")])
def test_a_tail_zero_prefill_runs_on_hybrid_sliding_and_moe_families(tiny_model, family, fill):
    """No exact row in any late layer: Gated DeltaNet layers still scan every filled row into their state
    (nofill: no row reaches a late layer), and the decoded last token matches the whole prompt's logits."""
    model, tok = tiny_model(family)
    rf = RidgeFill(model, tok, fill=fill, split=2, tail=1)
    ids = _ids(13)
    whole, given = rf.prefill(ids), rf.prefill(ids[:, :-1], for_generation=True)
    assert given.exact_rows.numel() == 0
    decoded = rf.extend(given, ids[:, -1:])[0, -1]
    assert torch.allclose(decoded, whole.logits[0], atol=1e-4, rtol=1e-4)
