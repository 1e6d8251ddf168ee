"""FastKV's per-layer KV capacity (#55 item 1) and its generation window (#55 item 2).

The kept rows are the authors' `FastKVCluster.update_kv` (dongwonjo/FastKV, `baseline/fastkv/fastkv_utils.py`
in the May 2025 release, `baselines/fastkv/utils.py` now) written out here from the stock model; the cost counts
what the cache keeps; a generation reads the same window as a whole-prompt prefill; decoding over the cut cache
continues at the prompt's positions.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from rf_eval.drop.fastkv import FastKV
from rf_eval.ridgefill.method import RidgeFill

N, WINDOW, KERNEL = 64, 8, 7


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def authors_kept(model, ids, capacity: int, pooling: str = "avg") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's kept keys and values by `update_kv`, on the stock model (every row propagates): the window
    queries' softmax over the layer's keys (causal in the window block), summed over the window rows, the
    window's keys left out, pooled (kernel 7, padding 3), summed over each key-value head's query heads, the
    top capacity - 8 rows per key-value head, then the window."""
    cfg = model.config
    out = model(input_ids=ids, output_hidden_states=True, use_cache=True)
    n, groups = ids.shape[1], cfg.num_attention_heads // cfg.num_key_value_heads
    cos, sin = model.model.rotary_emb(out.hidden_states[0], torch.arange(n)[None])
    kept = []
    for i, layer in enumerate(model.model.layers):
        keys, values = out.past_key_values.layers[i].keys, out.past_key_values.layers[i].values
        if n < capacity:
            kept.append((keys, values))
            continue
        h = layer.input_layernorm(out.hidden_states[i])
        q = layer.self_attn.q_proj(h).view(1, n, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        weights = (q[..., -WINDOW:, :].float() @ repeat_kv(keys, groups).float().transpose(2, 3)) / math.sqrt(cfg.head_dim)
        mask = torch.full((WINDOW, WINDOW), float("-inf")).triu(1)
        weights[..., -WINDOW:] += mask
        summed = weights.softmax(-1)[..., : n - WINDOW].sum(-2)
        pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
        pooled = pool(summed, KERNEL, padding=KERNEL // 2, stride=1)
        scores = pooled.view(1, -1, groups, n - WINDOW).sum(-2)
        top = scores.topk(capacity - WINDOW, -1).indices.sort(-1).values[..., None].expand(-1, -1, -1, cfg.head_dim)
        kept.append(tuple(torch.cat([t[:, :, :-WINDOW].gather(2, top), t[:, :, -WINDOW:]], 2) for t in (keys, values)))
    return kept


@pytest.mark.parametrize("pooling", ["avg", "max"])
def test_each_layer_keeps_the_authors_rows_per_key_value_head(tiny_model, pooling):
    model, tok = tiny_model("llama")
    ids = prompt()
    arm = FastKV(model, tok, selector=f"tsp(keep={N};capacity=24;pooling={pooling})")
    result = arm.prefill(ids)
    want = authors_kept(model, ids, 24, pooling)
    for layer, (keys, values) in zip(result.cache.layers, want):
        assert layer.keys.shape[2] == 24
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


def test_at_4096_tokens_the_default_keeps_half_the_cache_and_the_propagation_alone_three_quarters(tiny_model):
    """Acceptance of #55 item 1: capacity 2,048 on 4,096 tokens; `capacity=none` records the propagation's
    fraction as before (layers 0..2 every row, 3..5 the 2,048 propagated rows)."""
    model, tok = tiny_model("llama")
    ids = prompt(4096, seed=1)
    default, alone = FastKV(model, tok), FastKV(model, tok, selector="tsp(capacity=none)")
    for arm, fraction in ((default, 0.5), (alone, 0.75)):
        result = arm.prefill(ids)
        cost = arm.prefill_cost(4096, result)
        held = sum(layer.keys.shape[2] for layer in result.cache.layers)
        assert cost.cache_entries == held and held / cost.exact_cache_entries == fraction
    assert default.provenance()["release"].startswith("dongwonjo/FastKV b6ca98a")


@pytest.mark.parametrize("method, fields", [
    (FastKV, {"selector": "tsp(keep=24;capacity=none)"}),
    (RidgeFill, {"fill": "identity", "split": 3, "tail": 4, "selector": "attention(share=0.2;window=8;layers=0)"}),
])  # fmt: skip
def test_a_generation_prefill_keeps_the_rows_a_whole_prompt_prefill_keeps(tiny_model, method, fields):
    """#55 item 2: the window is the prompt's last rows for a generation as well (it used to be one row early)."""
    model, tok = tiny_model("llama")
    arm = method(model, tok, **fields)
    for seed in range(4):
        ids = prompt(seed=seed)
        whole, generation = arm.prefill(ids), arm.prefill(ids, for_generation=True)
        assert generation.exact_rows.tolist() == whole.exact_rows.tolist()
        assert generation.prompt_length == N - 1
        assert all(layer.keys.shape[2] == whole.cache.layers[i].keys.shape[2] - 1
                   for i, layer in enumerate(generation.cache.layers))


@torch.no_grad()
def test_decoding_over_the_cut_cache_runs_at_the_prompts_positions(tiny_model):
    """generate over the cut cache (the last prompt token run again, then each new token) equals the stock
    model stepped by hand over the same cache at positions N - 1, N, N + 1."""
    model, tok = tiny_model("llama")
    ids = prompt()
    arm = FastKV(model, tok, selector=f"tsp(keep={N};capacity=24)")
    out = arm.generate(ids, max_new_tokens=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cache = arm.prefill(ids, for_generation=True).cache
    token, position, scores = ids[:, -1:], N - 1, []
    for _ in range(3):
        logits = model(input_ids=token, cache=cache, use_cache=True, position_ids=torch.tensor([[position]])).logits
        scores.append(logits[:, -1])
        token, position = logits[:, -1:].argmax(-1), position + 1
    for got, want in zip(out.scores, scores):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("selector, says", [
    ("tsp(capacity=8)", "capacity must be more rows than the window (8)"),
    ("tsp(capacity=lots)", "capacity must be more rows than the window"),
    ("tsp(capacity_share=1.5)", "capacity_share must lie in (0, 1]"),
    ("tsp(pooling=median)", "pooling='median' is not valid; valid: avg, max"),
])  # fmt: skip
def test_bad_capacity_settings_are_refused(tiny_model, selector, says):
    from rf_eval.errors import UserError

    model, tok = tiny_model("llama")
    with pytest.raises((UserError, ValueError), match=says.replace("(", r"\(").replace(")", r"\)")):
        FastKV(model, tok, selector=selector)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_on_hybrid_models_the_default_keeps_caches_whole_and_another_capacity_is_refused(tiny_model, family):
    """The cut rewrites caches that hold their rows (`engine.rows_can_be_given_back`, read from the config):
    a model with Gated DeltaNet layers keeps its caches whole under the default, and says so; a capacity given
    on purpose is refused there, before any prefill. (Sliding-window models run no FastKV arm at all: its
    nofill late layers are refused on them.)"""
    model, tok = tiny_model(family)
    arm = FastKV(model, tok, selector="tsp(keep=16;layer=1)")
    assert arm.provenance()["capacity_applied"] is False and arm.capacity(4096) is None
    with pytest.raises(ValueError, match="sliding-window or recurrent layers: give capacity=none"):
        FastKV(model, tok, selector="tsp(keep=16;layer=1;capacity=512)")


@pytest.mark.parametrize("selector, n, plain", [
    ("tsp(keep=64)", 64, True),  # every row propagates and the capacity (64) keeps every row: the stock model
    ("tsp(keep=32)", 64, False),  # 24 of the 56 prefix rows propagate
    ("tsp(keep=64;capacity=32)", 64, False),  # every row propagates, but the caches are cut to 32 rows
    ("tsp(keep=64;capacity=none)", 64, True),
])  # fmt: skip
def test_a_prompt_whose_every_row_propagates_runs_the_stock_model(tiny_model, selector, n, plain):
    """Every row propagates on a prompt of at most `keep` rows, and the authors skip the selection on a prompt
    within the capacity (dongwonjo/FastKV, `baseline/fastkv/fastkv_utils.py`; the defaults keep = capacity =
    2,048 agree), so such a prompt runs the plain model, bit for bit: its logits and every layer's cache, at
    exact's MACs. A capacity that still cuts it keeps the engine's path."""
    from rf_eval.methods.exact import Exact

    model, tok = tiny_model("llama")
    method, ids = FastKV(model, tok, selector=selector), prompt(n)
    assert method.plan(n).plain is plain
    result, exact = method.prefill(ids), Exact(model, tok).prefill(ids)
    if plain:
        assert torch.equal(result.logits, exact.logits)
        assert all(torch.equal(layer.keys, exact.cache.layers[i].keys) for i, layer in enumerate(result.cache.layers))
        assert method.prefill_cost(n).macs_fraction == 1.0
    else:
        assert result.exact_rows.numel() < n or any(layer.keys.shape[2] < n for layer in result.cache.layers)
