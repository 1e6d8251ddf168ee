"""Speculative Prefill (issue #40, item 3): its rows are the authors' rule recomputed here from the speculator,
the target prefills them at their original positions, the tokens after the prompt run from position N, keeping
every row is the exact model bitwise, and its MACs (the speculator's included) are a count written here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from rf_eval.drop.specprefill import SpeculativePrefill
from rf_eval.engine import plain_prefill
from rf_eval.methods.dropped import DroppedResult

N, CHUNK, LOOKAHEAD = 100, 16, 4


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def authors_rows(spec, ids, share: float) -> list[int]:
    """The speculator's greedy look-ahead (the last prompt token, then LOOKAHEAD - 1 generated), each layer's
    and head's post-RoPE queries of those rows against the prompt's post-RoPE keys: softmax of the scaled
    logits over the N prompt keys, an average pool of 13 (padding 6, counted), the max over layers and heads,
    the mean over the rows; chunks of CHUNK rows by their mean, the top ceil(share x chunks), whole."""
    n, cfg = ids.shape[1], spec.config
    seq = ids
    for _ in range(LOOKAHEAD - 1):
        seq = torch.cat([seq, spec(input_ids=seq).logits[:, -1:].argmax(-1)], 1)
    hidden = spec(input_ids=seq, output_hidden_states=True).hidden_states
    per_layer = []
    for index, block in enumerate(spec.model.layers):
        h = block.input_layernorm(hidden[index])
        m = seq.shape[1]
        q = block.self_attn.q_proj(h).view(1, m, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        key = block.self_attn.k_proj(h).view(1, m, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = spec.model.rotary_emb(h, torch.arange(m)[None])
        q, key = apply_rotary_pos_emb(q, key, cos, sin)
        key = repeat_kv(key, cfg.num_attention_heads // cfg.num_key_value_heads)[:, :, :n]
        logits = (q[:, :, n - 1 :] @ key.transpose(-1, -2)).float() / cfg.head_dim**0.5
        per_layer.append(logits.softmax(-1)[0])  # (H, rows, N)
    probs = torch.cat(per_layer, 0)
    pooled = F.avg_pool1d(probs.reshape(-1, 1, n), 13, stride=1, padding=6).reshape(probs.shape)
    scores = pooled.amax(0).mean(0)
    chunks = [scores[i : i + CHUNK].mean() for i in range(0, n, CHUNK)]
    top = torch.topk(torch.stack(chunks), math.ceil(share * len(chunks))).indices.tolist()
    return sorted(r for c in top for r in range(c * CHUNK, min((c + 1) * CHUNK, n)))


def method(pair, **fields):
    target, spec, tok = pair[:3]
    return SpeculativePrefill(target, tok, source=spec, speculator_tokenizer=tok, chunk=CHUNK, lookahead=LOOKAHEAD,
                              **fields)


def test_the_kept_rows_are_the_authors_rule_at_their_positions(pair):
    target, spec = pair[:2]
    ids = prompt()
    sp = method(pair, keep_share=0.3)
    result = sp.prefill(ids)
    kept = authors_rows(spec, ids, 0.3)
    assert isinstance(result, DroppedResult) and result.kept.tolist() == kept == result.positions.tolist()
    with torch.no_grad():  # the target over the kept tokens at their original positions
        stock = target(input_ids=ids[:, kept], position_ids=torch.tensor([kept]), logits_to_keep=1).logits[:, -1]
    assert torch.equal(result.logits, stock)


def test_every_token_after_the_prompt_runs_from_position_n(pair):
    """The authors' scheduler counts all N prompt tokens as computed (`spec_prefill_worker.py`,
    `_record_and_update_requests`; `input_builder.py` numbers a decode step from that count): the first token
    comes from the last kept row's logits and the tokens after the prompt run at N, N+1, ... The prompt is
    one whose last row is not kept, where "after the last kept row" would differ."""
    target = pair[0]
    ids, cont = prompt(), prompt(4, seed=9)
    sp = method(pair, keep_share=0.3)
    result = sp.prefill(ids)
    kept = result.kept.tolist()
    assert kept[-1] < N - 1  # the case that tells the two rules apart
    after = list(range(N, N + 4))
    with torch.no_grad():
        want = target(input_ids=torch.cat([ids[:, kept], cont], 1), position_ids=torch.tensor([kept + after])).logits
    torch.testing.assert_close(sp.extend(result, cont), want[:, len(kept):], rtol=0, atol=1e-5)
    out = sp.generate(ids, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():  # greedy decoding written out: the kept rows at their positions, then N, N+1, ...
        seq, positions, steps = ids[:, kept], kept, []
        for step in range(5):
            steps.append(target(input_ids=seq, position_ids=torch.tensor([positions])).logits[:, -1])
            seq, positions = torch.cat([seq, steps[-1].argmax(-1, keepdim=True)], 1), positions + [N + step]
    assert out.sequences[0, N:].tolist() == seq[0, len(kept):].tolist()
    torch.testing.assert_close(torch.stack(out.logits), torch.stack(steps), rtol=0, atol=1e-5)


def test_keeping_every_row_is_the_exact_model_bitwise(pair):
    target = pair[0]
    ids = prompt()
    sp = method(pair, keep_share=1.0)
    assert sp.is_plain(N)
    assert torch.equal(sp.prefill(ids).logits, plain_prefill(target, ids).logits)
    assert torch.equal(sp.generate(ids, max_new_tokens=5, do_sample=False),
                       target.generate(ids, max_new_tokens=5, do_sample=False))


def test_the_cost_counts_the_speculator_and_the_kept_rows(pair):
    """The speculator's prefill of N rows and LOOKAHEAD - 1 single-row steps over its cache, each with its
    logits; the target's prefill of the kept rows; written from the two models' shapes."""
    target, spec = pair[:2]

    def dense(cfg, m, start=0):  # MACs of rows start..m-1 attending causally, every layer, no logits
        d, h, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        row = 2 * d * kv * hd + 2 * d * h * hd + 3 * d * cfg.intermediate_size
        pairs = m * (m + 1) // 2 - start * (start + 1) // 2
        return cfg.num_hidden_layers * ((m - start) * row + 2 * h * hd * pairs)

    sc, tc = spec.config, target.config
    speculator = dense(sc, N) + sc.hidden_size * sc.vocab_size
    speculator += sum(dense(sc, N + s, N + s - 1) + sc.hidden_size * sc.vocab_size for s in range(1, LOOKAHEAD))
    sp = method(pair, keep_share=0.3)
    k = sp.plan(N).setting
    assert k == CHUNK * math.ceil(0.3 * math.ceil(N / CHUNK))
    cost = sp.prefill_cost(N)
    assert cost.prefill_macs == speculator + dense(tc, k) + tc.hidden_size * tc.vocab_size
    assert cost.exact_macs == dense(tc, N) + tc.hidden_size * tc.vocab_size


def test_a_budget_sets_the_chunks(pair):
    sp = method(pair, budget=0.8)
    for n in (100, 400):
        chunks = sp.knob.setting(n)
        assert sp.prefill_cost(n).macs_fraction <= 0.8 < sp.knob.fraction(n, chunks + 1)
    assert sp.provenance()["knob"] == "chunks"


@pytest.mark.parametrize("fields, says", [
    ({"keep": 10}, "specprefill keeps whole chunks"),
    ({"keep_share": 0}, "0 < keep_share <= 1"),
    ({"chunk": 0}, "lookahead and chunk must be >= 1"),
    ({"filter_layer": 2}, "filter_layer is not a setting of method=specprefill"),
])
def test_bad_specprefill_settings_are_refused(pair, fields, says):
    from rf_eval.errors import UserError

    target, spec, tok = pair[:3]
    fields = {"chunk": CHUNK, "lookahead": LOOKAHEAD, **fields}
    with pytest.raises(UserError, match=says.replace("(", r"\(").replace(")", r"\)")):
        SpeculativePrefill(target, tok, source=spec, **fields)


def test_a_prompt_beyond_the_speculators_positions_is_refused_not_scored(pair, monkeypatch):
    """Past its positions the speculator's attention is meaningless; the prompt is refused, naming both counts
    (issue #54, item 5)."""
    from rf_eval.fields import ArmError

    sp = method(pair, keep_share=0.5)
    monkeypatch.setattr(sp.speculator.config, "max_position_embeddings", N + LOOKAHEAD - 2)
    with pytest.raises(ArmError, match=rf"a prompt of {N} tokens \(with {LOOKAHEAD - 1} look-ahead\) exceeds the "
                                       rf"speculator's {N + LOOKAHEAD - 2} positions"):
        sp.prefill(prompt())
    monkeypatch.setattr(sp.speculator.config, "max_position_embeddings", N + LOOKAHEAD - 1)
    assert isinstance(sp.prefill(prompt()), DroppedResult)
