"""FastKV's token-selective propagation as an arm (`preset=fastkv`, issue #40): its rows are the authors' rule
recomputed here from the stock model's hidden states, keeping every row is the exact model bitwise, and
decoding continues over the short late-layer caches as a reference forward on the kept rows does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from filled_reference import reference
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from rf_eval.engine import plain_prefill
from rf_eval.ridgefill.method import RidgeFill

N, WINDOW, KERNEL = 64, 8, 7


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def authors_rows(model, ids, tsp_layer: int, keep: int) -> list[int]:
    """FastKV's TSP rows written from its definition: layer T's post-RoPE window queries (last 8 rows) and keys,
    softmax of the scaled logits over every key (causal among the window rows) in fp32, summed over the window
    rows and every query head, the window's keys left out, an average pool of 7 (padding 3, counted), the top
    keep - 8 rows, then the window, in order."""
    n = ids.shape[1]
    hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[tsp_layer]  # the input to layer T
    layer = model.model.layers[tsp_layer]
    attn, cfg = layer.self_attn, model.config
    h = layer.input_layernorm(hidden)
    q = attn.q_proj(h).view(1, n, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(1, n, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = repeat_kv(k, cfg.num_attention_heads // cfg.num_key_value_heads)
    logits = (q[:, :, -WINDOW:] @ k.transpose(-1, -2)).float() / cfg.head_dim**0.5
    block = torch.ones(WINDOW, WINDOW, dtype=torch.bool).tril()
    logits[..., -WINDOW:] = logits[..., -WINDOW:].masked_fill(~block, float("-inf"))
    received = logits.softmax(-1).sum((0, 1, 2))[: n - WINDOW]
    pooled = F.avg_pool1d(received[None, None], KERNEL, stride=1, padding=KERNEL // 2)[0, 0]
    top = torch.topk(pooled, keep - WINDOW).indices
    return sorted(top.tolist()) + list(range(n - WINDOW, n))


def test_the_propagated_rows_are_the_authors_rule(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    arm = RidgeFill(model, tok, preset="fastkv", selector="tsp(keep=24)")
    assert arm.arm.plan.split == 3 and arm.arm.plan.tail == WINDOW and arm.arm.plan.fill == "nofill"
    result = arm.prefill(ids)
    assert result.exact_rows.tolist() == authors_rows(model, ids, tsp_layer=2, keep=24)
    assert result.ragged  # the late layers hold the 24 propagated rows only
    assert all(layer.keys.shape[2] == (N if i < 3 else 24) for i, layer in enumerate(result.cache.layers))


def test_keeping_every_row_is_the_exact_model_bitwise(tiny_model):
    """tsp_len at least the prompt: every row propagates; the prefill and the tokens decoded after it are the
    stock model's, bitwise (fp32)."""
    model, tok = tiny_model("llama")
    ids = prompt()
    for keep in (N, 4 * N):
        arm = RidgeFill(model, tok, preset="fastkv", selector=f"tsp(keep={keep})")
        result, stock = arm.prefill(ids), plain_prefill(model, ids)
        assert torch.equal(result.logits, stock.logits) and not result.ragged
        nxt = prompt(3, seed=5)
        assert torch.equal(arm.extend(result, nxt), model(input_ids=nxt, cache=stock.cache, use_cache=True).logits)
        full = model.generate(torch.cat([ids, nxt], 1), max_new_tokens=4, do_sample=False)
        assert torch.equal(arm.generate(torch.cat([ids, nxt], 1), max_new_tokens=4, do_sample=False), full)


def test_decoding_continues_over_the_propagated_rows_at_their_positions(tiny_model):
    """After the prefill, continuation tokens run every layer at positions N.. over the short late caches:
    their logits are a reference forward's whose late layers see only the kept prompt rows (written without
    the engine, `filled_reference`)."""
    model, tok = tiny_model("llama")
    ids, cont = prompt(), prompt(5, seed=3)
    arm = RidgeFill(model, tok, preset="fastkv", selector="tsp(keep=24)")
    result = arm.prefill(ids)
    dropped = torch.tensor([r for r in range(N) if r not in set(result.exact_rows.tolist())])
    got = arm.extend(result, cont)
    logits, _ = reference(model, torch.cat([ids, cont], 1), 3, dropped, absent=True)
    torch.testing.assert_close(got, logits[:, N:], rtol=0, atol=1e-4)


def test_the_cost_is_the_propagated_rows_layers(tiny_model):
    """MACs written here: layers 0..S-1 over every row; layers S.. over the 24 propagated rows only, causal
    among themselves; the last row's logits."""
    model, tok = tiny_model("llama")
    cfg = model.config
    arm = RidgeFill(model, tok, preset="fastkv", selector="tsp(keep=24)")
    result = arm.prefill(prompt())
    d, heads, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    row = 2 * d * kv * hd + 2 * d * heads * hd + 3 * d * cfg.intermediate_size

    def layer(m):
        return m * row + 2 * heads * hd * m * (m + 1) // 2

    want = 3 * layer(N) + 3 * layer(24) + d * cfg.vocab_size
    cost = arm.prefill_cost(N, result)
    assert cost.prefill_macs == want and cost.exact_macs == 6 * layer(N) + d * cfg.vocab_size
    assert cost.exact_rows == 24 and cost.cache_entries == 3 * N + 3 * 24


def test_a_budget_sets_the_propagated_rows(tiny_model):
    model, tok = tiny_model("llama")
    arm = RidgeFill(model, tok, preset="fastkv", budget=0.7)
    for n in (64, 200):
        rows = arm.plan(n).knob_value
        assert arm.prefill_cost(n, arm.prefill(prompt(n))).macs_fraction <= 0.7 < arm.arm.knob(model.config).fraction(n, rows + 1)
    assert arm.provenance()["knob"] == "rows" and arm.provenance()["selector"]["name"] == "tsp"


@pytest.mark.parametrize("fields, says", [
    ({"preset": "fastkv", "selector": "tsp(keep_share=0)"}, "keep_share must lie in"),
    ({"preset": "fastkv", "selector": "tsp(keep_share=1.5)"}, "keep_share must lie in"),
    ({"preset": "fastkv", "selector": "tsp(keep=0)"}, "keep must be >= 1"),
    ({"preset": "fastkv", "selector": "attention"}, "preset=fastkv runs selector tsp"),
    ({"preset": "fastkv", "split": 5}, "leave out split"),
    ({"fill": "nofill", "split": 6, "tail": 8, "selector": "tsp"}, "split 6 is outside 1..5"),
])
def test_bad_fastkv_settings_are_refused_before_any_prefill(tiny_model, fields, says):
    from rf_eval.errors import UserError

    model, tok = tiny_model("llama")
    with pytest.raises((UserError, ValueError), match=says):
        RidgeFill(model, tok, **fields)
