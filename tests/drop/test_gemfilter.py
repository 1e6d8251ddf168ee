"""GemFilter (issue #40, item 2): its rows are the authors' rule recomputed here from the stock model, its
prefill is the whole model on those rows at positions 0..k-1, decoding goes on from position k, keeping every
row is the exact model bitwise, and its MACs are a count written here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from rf_eval.drop.gemfilter import GemFilter
from rf_eval.engine import plain_prefill
from rf_eval.methods.dropped import DroppedResult

N, LAYER = 64, 2


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def authors_rows(model, ids, layer: int, k: int) -> list[int]:
    """Layer r's post-RoPE last-row query against every post-RoPE key: raw logits (no scale, no softmax),
    summed over the query heads, an average pool of 5 (padding 2, counted), the top k, sorted."""
    n = ids.shape[1]
    cfg = model.config
    hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[layer]
    block = model.model.layers[layer]
    h = block.input_layernorm(hidden)
    q = block.self_attn.q_proj(h).view(1, n, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
    key = block.self_attn.k_proj(h).view(1, n, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(n)[None])
    q, key = apply_rotary_pos_emb(q, key, cos, sin)
    key = repeat_kv(key, cfg.num_attention_heads // cfg.num_key_value_heads)
    scores = (q[:, :, -1:] @ key.transpose(-1, -2)).float()[0, :, 0].sum(0)
    pooled = F.avg_pool1d(scores[None, None], 5, stride=1, padding=2)[0, 0]
    return sorted(torch.topk(pooled, k).indices.tolist())


def test_the_kept_rows_are_the_authors_rule_and_pass_two_is_the_model_on_them(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    gem = GemFilter(model, tok, keep=20, filter_layer=LAYER)
    result = gem.prefill(ids)
    kept = authors_rows(model, ids, LAYER, 20)
    assert isinstance(result, DroppedResult) and result.kept.tolist() == kept == result.exact_rows.tolist()
    assert result.positions.tolist() == list(range(20))  # renumbered 0..k-1
    stock = plain_prefill(model, ids[:, kept])  # the whole model on the kept tokens alone
    assert torch.equal(result.logits, stock.logits)
    assert all(layer.keys.shape[2] == 20 for layer in result.cache.layers)  # k rows in every layer


def test_decoding_goes_on_from_position_k(tiny_model):
    """Continuation tokens and generated tokens run after the k kept rows, at positions k, k+1, ...: a reference
    forward over the kept tokens and the continuation, written here."""
    model, tok = tiny_model("llama")
    ids, cont = prompt(), prompt(4, seed=9)
    gem = GemFilter(model, tok, keep=20, filter_layer=LAYER)
    result = gem.prefill(ids)
    kept = result.kept
    with torch.no_grad():
        want = model(input_ids=torch.cat([ids[:, kept], cont], 1)).logits[:, 20:]
    torch.testing.assert_close(gem.extend(result, cont), want, rtol=0, atol=1e-5)
    # generation: the cache holds the kept rows but the last, and generate runs the last kept row first
    out = gem.generate(ids, max_new_tokens=6, do_sample=False)
    reference = model.generate(ids[:, kept], max_new_tokens=6, do_sample=False)
    assert out[0, N:].tolist() == reference[0, 20:].tolist() and torch.equal(out[:, :N], ids)


def test_keeping_every_row_is_the_exact_model_bitwise(tiny_model):
    model, tok = tiny_model("llama")
    ids = prompt()
    for fields in ({"keep": N}, {"keep": 1024}, {"keep_share": 1.0}):
        gem = GemFilter(model, tok, filter_layer=LAYER, **fields)
        assert gem.is_plain(N)
        result, stock = gem.prefill(ids), plain_prefill(model, ids)
        assert torch.equal(result.logits, stock.logits) and not isinstance(result, DroppedResult)
        full = model.generate(ids, max_new_tokens=5, do_sample=False)
        assert torch.equal(gem.generate(ids, max_new_tokens=5, do_sample=False), full)
        assert gem.prefill_cost(N).macs_fraction == 1.0


def test_the_cost_is_both_passes_counted_here(tiny_model):
    """Pass 1: layers 0..r over every row, and the last row's query against every key of layer r; pass 2:
    the whole model over the k kept rows; the last kept row's logits."""
    model, tok = tiny_model("llama")
    cfg = model.config
    d, heads, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    row = 2 * d * kv * hd + 2 * d * heads * hd + 3 * d * cfg.intermediate_size

    def layer(m):
        return m * row + 2 * heads * hd * m * (m + 1) // 2

    cost = GemFilter(model, tok, keep=20, filter_layer=LAYER).prefill_cost(N)
    assert cost.prefill_macs == (LAYER + 1) * layer(N) + heads * hd * N + 6 * layer(20) + d * cfg.vocab_size
    assert cost.exact_macs == 6 * layer(N) + d * cfg.vocab_size
    assert cost.exact_rows == 20 and cost.cache_entries == 6 * 20 and cost.fields()["cache_fraction"] == 20 / N


def test_a_budget_sets_k_within_one_row(tiny_model):
    model, tok = tiny_model("llama")
    gem = GemFilter(model, tok, budget=0.6, filter_layer=LAYER)
    for n in (64, 300):
        k = gem.plan(n).setting
        assert gem.prefill_cost(n).macs_fraction <= 0.6 < gem.knob.fraction(n, k + 1)
        assert gem.prefill_cost(n).knob_value == k
    assert len(gem.prefill(prompt()).kept) == gem.plan(N).setting
    assert gem.provenance()["budget"] == 0.6 and gem.provenance()["knob"] == "rows"


@pytest.mark.parametrize("fields, says", [
    ({"keep": 0}, "keeps at least 1 row"),
    ({"keep_share": 0.0}, "0 < keep_share <= 1"),
    ({"keep_share": 1.5}, "0 < keep_share <= 1"),
    ({"keep": 10, "budget": 0.5}, "give one of keep, keep_share and budget"),
    ({"filter_layer": 5}, "filter_layer=5 is outside 0..4"),
    ({"filter_layer": -1}, "filter_layer=-1 is outside"),
    ({"lookahead": 4}, "lookahead is not a setting of method=gemfilter"),
    ({"budget": 0.01}, "budget=0.01 is below the cheapest"),
])
def test_bad_gemfilter_settings_are_refused(tiny_model, fields, says):
    from rf_eval.errors import UserError

    model, tok = tiny_model("llama")
    with pytest.raises(UserError, match=says.replace("(", r"\(").replace(")", r"\)")):
        GemFilter(model, tok, **fields)


@pytest.mark.parametrize("config, layer, source", [
    # SalesforceAIResearch/GemFilter `needle_eval.py`: select_layer_idx 13 (Llama-3.1-8B-Instruct), 19
    # (Mistral-Nemo-Instruct-2407), 19 (Phi-3.5-mini-instruct); the shapes are those models' config.json
    ({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256}, 13,
     "Llama-3.1-8B-Instruct"),
    ({"model_type": "mistral", "num_hidden_layers": 40, "hidden_size": 5120, "vocab_size": 131072}, 19,
     "Mistral-Nemo-Instruct-2407"),
    ({"model_type": "phi3", "num_hidden_layers": 32, "hidden_size": 3072, "vocab_size": 32064}, 19,
     "Phi-3.5-mini-instruct"),
    # any other model: floor(13 L / 32), ours (Mistral-Nemo's depth with another width is not Mistral-Nemo)
    ({"model_type": "mistral", "num_hidden_layers": 40, "hidden_size": 4096, "vocab_size": 131072}, 16, "floor"),
    ({"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "vocab_size": 151936}, 14, "floor"),
])  # fmt: skip
def test_the_filter_layer_is_the_authors_for_the_models_they_ran_and_the_formula_elsewhere(config, layer, source):
    from types import SimpleNamespace

    from rf_eval.drop.gemfilter import default_filter_layer

    got, said = default_filter_layer(SimpleNamespace(**config))
    assert got == layer and source in said


def test_the_provenance_says_where_the_filter_layer_came_from(tiny_model):
    model, tok = tiny_model("llama")
    default, given = GemFilter(model, tok, keep=20), GemFilter(model, tok, keep=20, filter_layer=LAYER)
    layers = model.config.num_hidden_layers
    assert default.provenance()["filter_layer"] == layers * 13 // 32
    assert default.provenance()["filter_layer_from"].startswith("floor(13 L / 32)")
    assert (given.provenance()["filter_layer"], given.provenance()["filter_layer_from"]) == (LAYER, "filter_layer=")
