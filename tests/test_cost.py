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
