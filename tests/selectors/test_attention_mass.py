"""The selectors' attention mass is the stock layer's softmax: sinks (GPT-OSS) and sliding windows included."""

from __future__ import annotations

import types

import pytest
import torch

from rf_eval.selectors.attention import attention_mass


@pytest.mark.parametrize("window", [None, 5])
def test_mass_and_output_equal_gpt_oss_eager_attention_with_its_sinks(window):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    torch.manual_seed(0)
    heads, kv_heads, dim, keys, queries = 4, 2, 8, 12, 4
    q = torch.randn(1, heads, queries, dim)
    k, v = torch.randn(1, kv_heads, keys, dim), torch.randn(1, kv_heads, keys, dim)
    sinks = torch.randn(heads) * 2
    q_pos, k_pos = torch.arange(keys - queries, keys), torch.arange(keys)
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    mask = torch.zeros(queries, keys).masked_fill(~allowed, float("-inf"))[None, None]
    module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=heads // kv_heads, training=False)
    out, weights = eager_attention_forward(module, q, k, v, mask, scaling=dim**-0.5)

    received, context = attention_mass(q, k, dim**-0.5, q_pos, k_pos, v, window, sinks)
    torch.testing.assert_close(received, weights.sum((0, 1, 2)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(context, out.reshape(1, queries, -1), rtol=1e-6, atol=1e-6)
    assert weights.sum(-1).max() < 0.999  # the sinks took weight: without them the mass would differ
    without, _ = attention_mass(q, k, dim**-0.5, q_pos, k_pos, v, window)
    assert not torch.allclose(without, received)
