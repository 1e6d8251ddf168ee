"""The capture pass hands every late layer the input the unmodified model gives it, and runs no further."""

import pytest
import torch

from rf_eval.engine import decoder_layers
from rf_eval.ridge.capture import run_with_layer_hooks


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_next"])
def test_the_hooks_see_the_stock_layer_inputs_and_the_last_layer_never_runs(tiny_model, family):
    model, tok = tiny_model(family)
    ids = tok("the capture pass reads each late layer's input once", return_tensors="pt").input_ids
    with torch.no_grad():
        stock = model(input_ids=ids, output_hidden_states=True).hidden_states  # stock[l]: the input of layer l
    layers = decoder_layers(model)
    ran = []
    handle = layers[-1].register_forward_hook(lambda *_: ran.append(True))
    seen: dict[int, torch.Tensor] = {}
    try:
        run_with_layer_hooks(model, ids, 2, lambda index, x, _kwargs: seen.setdefault(index, x.clone()))
    finally:
        handle.remove()
    assert sorted(seen) == list(range(2, len(layers)))
    for index, x in seen.items():
        assert torch.equal(x, stock[index]), index
    assert not ran  # what the last layer computes is never read
    handle = layers[-1].register_forward_hook(lambda *_: ran.append(True))
    try:
        with torch.no_grad():  # and the capture's hooks are gone: a plain forward runs every layer again
            assert torch.equal(model(input_ids=ids, output_hidden_states=True).hidden_states[-2], stock[-2])
    finally:
        handle.remove()
    assert ran == [True]
