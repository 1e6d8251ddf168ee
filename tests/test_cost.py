import pytest
from transformers import LlamaConfig

from rf_eval.ridgefill.cost import ceiling_r, cost_matched_tail, prefill_macs, speedup_ceiling


def test_ceiling_matches_flash_next_figures():
    # Paper section 2.5: L=48, S=24, T=2,048 -> 1.64x, 1.78x, 1.88x at 9,216 / 16,384 / 32,768 tokens
    got = [round(1 / ceiling_r(48, 24, 2048, n), 2) for n in (9216, 16384, 32768)]
    assert got == [1.64, 1.78, 1.88]
    assert ceiling_r(48, 24, 4096, 4096) == 1.0
    with pytest.raises(ValueError):
        ceiling_r(48, 49, 10, 100)


@pytest.fixture
def llama8b():
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256)


def test_mac_model_orders_the_arms(llama8b):
    n, s, t = 32768, 16, 4096
    exact = prefill_macs(llama8b, n)
    identity = prefill_macs(llama8b, n, split=s, tail=t, fill="identity")
    ridge = prefill_macs(llama8b, n, split=s, tail=t, fill="ridge")
    rows = prefill_macs(llama8b, n, split=s, tail=t, fill="ridge", exact_rows=2867)
    nofill = prefill_macs(llama8b, n, split=s, tail=t, fill="nofill")
    assert nofill < identity < ridge < rows < exact
    # maps: d*d per filled row per late layer above the split
    assert ridge - identity == (n - t) * 4096 * 4096 * (32 - s - 1)
    # the MAC ceiling is below the layer-pass ceiling (filled rows still pay K/V and maps)
    assert speedup_ceiling(llama8b, n, split=s, tail=t, fill="ridge") < 1 / ceiling_r(32, s, t, n)
    assert prefill_macs(llama8b, n, split=s, tail=n, fill="ridge") == exact


def test_cost_matched_tail(llama8b):
    n, s = 16384, 16
    target = prefill_macs(llama8b, n, split=s, tail=2048, fill="ridge")
    t = cost_matched_tail(llama8b, n, s, target)
    assert prefill_macs(llama8b, n, split=s, tail=t, fill="nofill") <= target
    assert prefill_macs(llama8b, n, split=s, tail=t + 1, fill="nofill") > target
    assert t > 2048


def test_sliding_window_layers_charge_at_most_the_window(llama8b):
    from transformers import MistralConfig, Qwen3Config

    from rf_eval.ridgefill.cost import _causal_pairs

    assert _causal_pairs(0, 10, 4) == 1 + 2 + 3 + 4 * 7 and _causal_pairs(6, 10, 4) == 16
    assert _causal_pairs(2, 10, 4) == 3 + 4 * 7 and _causal_pairs(0, 10, 100) == _causal_pairs(0, 10) == 55
    shapes = {k: getattr(llama8b, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_attention_heads", "num_key_value_heads", "vocab_size")}
    n, s, t, w = 32768, 16, 4096, 4096
    full, windowed = MistralConfig(**shapes, sliding_window=None), MistralConfig(**shapes, sliding_window=w)
    attn = 2 * 32 * 128  # MACs per (query, key) pair
    assert prefill_macs(full, n) - prefill_macs(windowed, n) == 32 * attn * (_causal_pairs(0, n) - _causal_pairs(0, n, w))
    for arm in (dict(fill="ridge"), dict(fill="ridge", exact_rows=2867), dict(fill="nofill")):
        assert prefill_macs(windowed, n, split=s, tail=t, **arm) < prefill_macs(full, n, split=s, tail=t, **arm)
    # Qwen3 with use_sliding_window: only the layers from max_window_layers on slide
    hybrid = Qwen3Config(**shapes, head_dim=128, use_sliding_window=True, sliding_window=w, max_window_layers=28)
    dense = Qwen3Config(**shapes, head_dim=128)
    assert prefill_macs(dense, n) - prefill_macs(hybrid, n) == 4 * attn * (_causal_pairs(0, n) - _causal_pairs(0, n, w))
