"""Invariants of the partial-prefill engine on tiny random models of every family."""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rf_eval.cli.check_equivalence import cache_tensors, compare
from rf_eval.engine import Plan, plain_prefill, prefill
from rf_eval.ridgefill.api import RidgeFill
from rf_eval.ridgefill.maps import identity_fill
from rf_eval.testing import FAMILIES  # every registered family

N = 48


def prompt(n=N, seed=0, vocab=250):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def scaled_fill(layer, x):
    """A deterministic non-identity fill, so ridge-like arms are exercised without fitting."""
    return x * (1.0 + 0.05 * layer)


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_off_is_bitwise_plain_model(tiny_model, family):
    model, _ = tiny_model(family)
    ids = prompt()
    ref = plain_prefill(model, ids)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        all_rows = model(input_ids=ids).logits
    assert torch.equal(ref.logits, out.logits[:, -1])
    torch.testing.assert_close(ref.logits, all_rows[:, -1], rtol=1e-5, atol=1e-5)
    cases = [
        (Plan(split=3, tail=1, fill="exact"), None),
        (Plan(split=3, tail=N, fill="nofill"), None),
        (Plan(split=2, tail=N, fill="identity"), identity_fill),
        (Plan(split=4, tail=N + 5, fill="ridge"), scaled_fill),
    ]
    for plan, fill in cases:
        got = prefill(model, ids, plan, fill=fill)
        assert compare(got, ref) is None, plan
        plain_tensors = cache_tensors(out.cache if hasattr(out, "cache") else out.past_key_values)
        assert all(torch.equal(a, b) for a, b in zip(cache_tensors(got.cache), plain_tensors))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_from_engine_cache_matches_generate(tiny_model, family):
    model, _ = tiny_model(family)
    ids = prompt(32, seed=1)
    rf = RidgeFill(model, split=3, tail=4, fill="exact")
    want = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(rf.generate(ids, max_new_tokens=6, do_sample=False), want)
    rf_full_tail = RidgeFill(model, split=3, tail=64, fill="identity")
    assert torch.equal(rf_full_tail.generate(ids, max_new_tokens=6, do_sample=False), want)


@pytest.mark.parametrize("family", FAMILIES)
def test_filled_arm_differs_and_exact_rows_run_late_layers(tiny_model, family):
    model, _ = tiny_model(family)
    ids = prompt()
    ref = plain_prefill(model, ids)
    tail = 8
    filled = prefill(model, ids, Plan(split=3, tail=tail, fill="identity"), fill=identity_fill)
    assert (filled.logits - ref.logits).abs().max() > 1e-3
    # every prefix row selected exact: the late layers run them all, so the arm is exact again
    all_rows = prefill(
        model, ids, Plan(split=3, tail=tail, fill="identity"), fill=identity_fill,
        select=lambda ctx: torch.arange(N - tail),
    )
    torch.testing.assert_close(all_rows.logits, ref.logits, rtol=1e-5, atol=1e-5)
    some = prefill(
        model, ids, Plan(split=3, tail=tail, fill="identity"), fill=identity_fill,
        select=lambda ctx: torch.tensor([0, 5, 17]),
    )
    assert some.exact_rows.tolist() == [0, 5, 17, *range(N - tail, N)]
    assert not torch.equal(some.logits, filled.logits)


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_identity_writes_kv_of_split_state(tiny_model, family):
    """Filled rows' cached K/V in a late attention layer = that layer's projections of x_S."""
    model, _ = tiny_model(family)
    ids = prompt()
    split, tail, layer_index = 2, 8, 4
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        x_split = hidden[split]
        layer = model.model.layers[layer_index]
        attn = layer.self_attn
        h = layer.input_layernorm(x_split)
        shape = (1, N, -1, attn.head_dim)
        k = attn.k_proj(h).view(shape)
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        k = k.transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x_split, torch.arange(N)[None])
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
    got = prefill(model, ids, Plan(split=split, tail=tail, fill="identity"), fill=identity_fill)
    cached = got.cache.layers[layer_index]
    prefix = slice(0, N - tail)
    torch.testing.assert_close(cached.keys[:, :, prefix], k[:, :, prefix], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cached.values[:, :, prefix], v[:, :, prefix], rtol=1e-6, atol=1e-6)
    # lower layers are untouched: their cache equals the plain model's
    ref = plain_prefill(model, ids)
    assert torch.equal(got.cache.layers[0].keys, ref.cache.layers[0].keys)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_nofill_late_layers_hold_only_exact_rows_and_continue(tiny_model, family):
    model, _ = tiny_model(family)
    ids = prompt()
    rf = RidgeFill(model, split=3, tail=8, fill="nofill")
    result = rf.prefill(ids)
    assert result.ragged
    attn_late = [i for i, t in enumerate(getattr(model.config, "layer_types", None) or ["full_attention"] * 6)
                 if t == "full_attention" and i >= 3]
    for i in attn_late:
        assert result.cache.layers[i].keys.shape[2] == 8
    cont = prompt(5, seed=3)
    logits = rf.extend(result, cont)
    again = rf.prefill(ids)
    steps = torch.cat([rf.extend(again, cont[:, i : i + 1]) for i in range(5)], 1)
    assert torch.equal(logits, steps)


def test_continuation_over_filled_cache_equals_teacher_forced_decoding(tiny_model):
    model, _ = tiny_model("qwen3")
    rf = RidgeFill(model, split=3, tail=8, fill="identity")
    ids, cont = prompt(), prompt(6, seed=4)
    together = rf.extend(rf.prefill(ids), cont)
    result = rf.prefill(ids)
    one_by_one = torch.cat([rf.extend(result, cont[:, i : i + 1]) for i in range(6)], 1)
    torch.testing.assert_close(together, one_by_one, rtol=1e-5, atol=1e-5)


def test_chunked_lower_layers_match_one_pass(tiny_model):
    model, _ = tiny_model("llama")
    ids = prompt()
    one = prefill(model, ids, Plan(split=3, tail=8, fill="identity"), fill=identity_fill)
    chunked = prefill(model, ids, Plan(split=3, tail=8, fill="identity", chunk_size=16), fill=identity_fill)
    torch.testing.assert_close(one.logits, chunked.logits, rtol=1e-5, atol=1e-5)


def test_bad_plans_are_refused(tiny_model):
    model, _ = tiny_model("llama")
    ids = prompt()
    with pytest.raises(ValueError, match="split 6 is outside 1..5"):
        prefill(model, ids, Plan(split=6, tail=4, fill="identity"), fill=identity_fill)
    with pytest.raises(ValueError, match="split 0 is outside 1..5"):
        prefill(model, ids, Plan(split=0, tail=4, fill="nofill"))
    with pytest.raises(ValueError, match="unknown fill 'magic'; valid fills: exact, nofill, identity, ridge"):
        Plan(split=3, tail=4, fill="magic")
    with pytest.raises(ValueError, match="needs a fill function"):
        prefill(model, ids, Plan(split=3, tail=4, fill="ridge"))
    with pytest.raises(ValueError, match="exact rows must lie in the prefix"):
        prefill(model, ids, Plan(split=3, tail=4, fill="nofill"), select=lambda ctx: torch.tensor([N - 1]))
    with pytest.raises(ValueError, match="fill='ridgy' is not valid; valid fills: exact"):
        RidgeFill(model, fill="ridgy")
    with pytest.raises(ValueError, match="needs maps"):
        RidgeFill(model, fill="ridge")


def test_check_equivalence_command(tiny_model_dir, tiny_model, capsys):
    from rf_eval.cli import main

    assert main(["check-equivalence", "--model", tiny_model_dir("qwen3_5"), "--lengths", "12", "--device", "cpu",
                 "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert out.count("OK") == 4 and "FAIL" not in out
    # and the comparison it relies on does catch a one-ulp change in any cache tensor
    model, _ = tiny_model("llama")
    a, b = plain_prefill(model, prompt(12)), plain_prefill(model, prompt(12))
    assert compare(a, b) is None
    b.cache.layers[5].values[0, 0, 3, 0] = torch.nextafter(b.cache.layers[5].values[0, 0, 3, 0], torch.tensor(9.0))
    assert compare(a, b) == "cache tensor 11 differs"


@pytest.mark.parametrize("keys_are_exact_rows", [False, True])
def test_exact_row_attention_spans_only_the_causal_keys(monkeypatch, keys_are_exact_rows):
    """Selected prefix rows attend in small chunks over the keys up to their last position; same result."""
    import rf_eval.engine.attention as engine

    g = torch.Generator().manual_seed(3)
    n, tail, heads, kv_heads, dim = 400, 40, 4, 2, 8
    selected = torch.randperm(n - tail, generator=g)[:150].sort().values
    q_pos = torch.cat([selected, torch.arange(n - tail, n)])
    k_pos = q_pos if keys_are_exact_rows else torch.arange(n)
    q = torch.randn(1, heads, q_pos.numel(), dim, generator=g)
    k = torch.randn(1, kv_heads, k_pos.numel(), dim, generator=g)
    v = torch.randn(1, kv_heads, k_pos.numel(), dim, generator=g)
    whole = engine._attend(q, k, v, q_pos, k_pos, 0.3)  # one masked call over every key

    calls = []
    real = engine._attend

    def spy(q_, k_, v_, qp, kp, scale, *masking):
        calls.append((qp.clone(), kp.numel()))
        return real(q_, k_, v_, qp, kp, scale, *masking)

    monkeypatch.setattr(engine, "_attend", spy)
    chunks = engine.QueryChunks(query_chunk=4096, prefix_end=n - tail)
    got = engine.attend_exact_rows(q, k, v, q_pos, k_pos, 0.3, chunks)
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)
    assert sum(qp.numel() for qp, _ in calls) == q_pos.numel()
    for qp, n_keys in calls:
        if qp[0] < n - tail:  # a prefix chunk: only the keys at or before its last query
            assert qp.numel() <= engine.PREFIX_QUERY_CHUNK and qp[-1] < n - tail
            assert n_keys == int((k_pos <= qp[-1]).sum())
        else:  # the tail: one chunk over every key
            assert n_keys == k_pos.numel()
    assert len(calls) == -(-selected.numel() // engine.PREFIX_QUERY_CHUNK) + 1


def test_is_plain_names_exactly_the_prompts_prefilled_by_the_plain_model(tiny_model, monkeypatch):
    """RidgeFill.is_plain (the rule the adapters and the server use) agrees with what prefill runs."""
    import rf_eval.engine as engine

    model, tok = tiny_model("llama")
    arms = {
        "exact": RidgeFill(model, tok, fill="exact", tail=4),
        "identity tail 16": RidgeFill(model, tok, fill="identity", tail=16),
        "identity chunked": RidgeFill(model, tok, fill="identity", tail=64, chunk_size=8),
        "identity + rows": RidgeFill(model, tok, fill="identity", tail=4, selector="random(count=2;seed=0)"),
    }
    want = {("exact", 12): True, ("exact", 40): True, ("identity tail 16", 12): True,
            ("identity tail 16", 40): False, ("identity chunked", 12): False, ("identity + rows", 12): False}
    calls = []
    real = engine.plain_prefill
    monkeypatch.setattr(engine, "plain_prefill", lambda *a, **k: calls.append(1) or real(*a, **k))
    for (name, n), expected in want.items():
        assert arms[name].is_plain(n) is expected, (name, n)
        calls.clear()
        arms[name].prefill(prompt(n))
        assert bool(calls) is expected, (name, n)
