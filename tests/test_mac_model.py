import pytest
from transformers import LlamaConfig

from rf_eval.cost.mac_model import ceiling_r, cost_matched_tail, prefill_macs, speedup_ceiling


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
    # maps: d*d per filled row per late layer where a map is used: from layer S+1 by default (S reads x_S) ...
    assert ridge - identity == (n - t) * 4096 * 4096 * (32 - s - 1)
    # ... and at layer S too with map_split (the paper's released maps and MAC counts)
    ridge_split_map = prefill_macs(llama8b, n, split=s, tail=t, fill="ridge", map_split=True)
    assert ridge_split_map - identity == (n - t) * 4096 * 4096 * (32 - s)
    assert prefill_macs(llama8b, n, split=s, tail=t, fill="identity", map_split=True) == identity
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


def crossover(config, split: int, pop_split: int, **arm) -> int:
    """The shortest prompt above which RidgeFill (tail 4,096, no exact rows) costs fewer MACs than POP
    (identity fill from layer L - floor(L/3), one-token tail), searched by bisection (cost gap monotone)."""
    def cheaper(n):
        ridge = prefill_macs(config, n, split=split, tail=4096, fill="ridge", **arm)
        return ridge < prefill_macs(config, n, split=pop_split, tail=1, fill="identity")

    lo, hi = 4097, 1 << 20
    assert not cheaper(lo) and cheaper(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cheaper(mid) else (mid, hi)
    return hi


def test_pop_crossovers_of_the_paper():
    """Paper section 2.5 / 6.4 (Figure 7): RidgeFill costs less than POP above about 14K tokens at half
    depth and 46K at 5/8 depth on Llama-3.1-8B; on Qwen3-8B split 13 above about 10.6K, and split 22
    below about 59K costs more (1.04x POP at 32K, 0.99x at 64K). The paper charges the map at layer S, so
    its figures are map_split=true's, named here; rf-eval's default arm uses no map at S."""
    from transformers import Qwen3Config

    llama = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=128, vocab_size=128256)
    qwen = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936)
    pop_llama, pop_qwen = 32 - 32 // 3, 36 - 36 // 3
    assert (pop_llama, pop_qwen) == (22, 24)
    paper = {"map_split": True}
    assert round(crossover(llama, 20, pop_llama, **paper) / 1000) == 46
    assert round(crossover(llama, 16, pop_llama, **paper) / 1000) == 14
    assert round(crossover(qwen, 22, pop_qwen, **paper) / 1000) == 59
    assert round(crossover(qwen, 13, pop_qwen, **paper) / 100) == 106
    pop = {n: prefill_macs(qwen, n, split=pop_qwen, tail=1, fill="identity") for n in (32768, 65536)}
    ratio = {n: prefill_macs(qwen, n, split=22, tail=4096, fill="ridge", **paper) / pop[n] for n in pop}
    assert (round(ratio[32768], 2), round(ratio[65536], 2)) == (1.04, 0.99)
    # the default arm (no map at S) crosses earlier (about 44.4K and 57.4K): not the paper's counts
    assert round(crossover(llama, 20, pop_llama) / 1000) == 44
    assert round(crossover(qwen, 22, pop_qwen) / 1000) == 57

def test_sliding_window_layers_charge_at_most_the_window(llama8b):
    from transformers import MistralConfig, Qwen3Config

    from rf_eval.cost.mac_model import causal_pairs

    assert causal_pairs(0, 10, 4) == 1 + 2 + 3 + 4 * 7 and causal_pairs(6, 10, 4) == 16
    assert causal_pairs(2, 10, 4) == 3 + 4 * 7 and causal_pairs(0, 10, 100) == causal_pairs(0, 10) == 55
    shapes = {k: getattr(llama8b, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_attention_heads", "num_key_value_heads", "vocab_size")}
    n, s, t, w = 32768, 16, 4096, 4096
    full, windowed = MistralConfig(**shapes, sliding_window=None), MistralConfig(**shapes, sliding_window=w)
    attn = 2 * 32 * 128  # MACs per (query, key) pair
    assert prefill_macs(full, n) - prefill_macs(windowed, n) == 32 * attn * (causal_pairs(0, n) - causal_pairs(0, n, w))
    for arm in (dict(fill="ridge"), dict(fill="ridge", exact_rows=2867), dict(fill="nofill")):
        assert prefill_macs(windowed, n, split=s, tail=t, **arm) < prefill_macs(full, n, split=s, tail=t, **arm)
    # Qwen3 with use_sliding_window: only the layers from max_window_layers on slide
    hybrid = Qwen3Config(**shapes, head_dim=128, use_sliding_window=True, sliding_window=w, max_window_layers=28)
    dense = Qwen3Config(**shapes, head_dim=128)
    assert prefill_macs(dense, n) - prefill_macs(hybrid, n) == 4 * attn * (causal_pairs(0, n) - causal_pairs(0, n, w))
