"""Invariants of the partial-prefill engine on tiny random models of every family.

Each one runs the engine's partial path (a plan with no filled row is sent there by a selector; the plain
model's shortcut is `test_is_plain_...`'s subject) and checks it against something the engine does not
compute: the stock model, or the stock forward with the filled rows' late inputs replaced
(`filled_reference`), before and after the stock model continues from the engine's cache.
"""

import pytest
import torch
from filled_reference import assert_matches, reference, split_state
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rf_eval.cli.check_equivalence import compare
from rf_eval.engine import AbsentRows, Plan, plain_prefill, prefill
from rf_eval.fills import fill_named
from rf_eval.ridge.maps import identity_fill
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.testing import FAMILIES  # every registered family

N = 48


def prompt(n=N, seed=0, vocab=250):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def scaled_fill(layer, x):
    """A deterministic non-identity fill, so ridge-like arms are exercised without fitting."""
    return x * (1.0 + 0.05 * layer)


def no_row(ctx):
    """A selector that selects nothing (the late layers run every row exact anyway: no row is filled)."""
    return torch.zeros(0, dtype=torch.long)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_filled_row_on_the_partial_path_is_the_stock_model(tiny_model, family):
    """Fill exact, or a tail covering the prompt, run through the partial path itself (lower layers stopped
    at the split, a selector, the late layers, the fill's strategy): bitwise the stock model, cache included.
    (A method runs such prompts through the plain forward: `test_is_plain_names_exactly_...` checks that rule.)"""
    model, _ = tiny_model(family)
    ids = prompt()
    ref = plain_prefill(model, ids)
    cases = [
        (Plan(split=3, tail=1, fill="exact"), None),
        (Plan(split=3, tail=N, fill="nofill"), AbsentRows()),
        (Plan(split=2, tail=N, fill="identity"), identity_fill),
        (Plan(split=4, tail=N + 5, fill="ridge", map_split=True), scaled_fill),  # even x̂_S is never read
    ]
    for plan, fill in cases:
        got = prefill(model, ids, plan, fill=fill, select=no_row)
        assert got.plan is not None and got.timings.get("late", 0) > 0, plan  # the late layers ran, not plain
        assert got.exact_rows.tolist() == list(range(N)) and not got.ragged
        assert compare(got, ref) is None, plan


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_continues_from_the_filled_cache(tiny_model, family):
    """`generate` after a filled prefill continues from the engine's cache: each step's logits equal the stock
    model's decoding over a prompt cache built without the engine (the stock forward with the filled rows'
    late inputs replaced); the filled rows are the full prompt's (the last prompt token runs in generate)."""
    model, _ = tiny_model(family)
    ids, split, tail, steps = prompt(32, seed=1), 3, 4, 6
    rf = RidgeFill(model, split=split, tail=tail, fill="identity", map_split=False)
    out = rf.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True,
                      return_dict_in_generate=True)  # min_new_tokens: never stop at (masked) end of text
    assert out.sequences.shape[1] == 32 + steps
    logits, by_hand = reference(model, ids, split, torch.arange(32 - tail), split_state)  # a cache built by hand
    seq = ids
    for step in range(steps):
        if step:  # the stock model, one token at a time over that cache
            with torch.no_grad():
                logits = model(input_ids=seq[:, -1:], cache=by_hand, use_cache=True,
                               position_ids=torch.tensor([[seq.shape[1] - 1]])).logits
        torch.testing.assert_close(out.logits[step], logits[:, -1], rtol=0, atol=1e-4)
        choice = logits[:, -1].clone()
        choice[:, model.generation_config.eos_token_id] = float("-inf")
        seq = torch.cat([seq, choice.argmax(-1, keepdim=True)], 1)
    assert torch.equal(out.sequences, seq)  # greedy: the reference's own choices
    stock = plain_prefill(model, ids).logits
    assert (out.logits[0] - stock).abs().max() > 1e-2  # a filled arm: re-prefilling with the stock model fails


@pytest.mark.parametrize("family", FAMILIES)
def test_filled_prefill_is_the_stock_forward_with_predicted_inputs(tiny_model, family):
    """Filled rows read x̂_l = fill(l, x_S) in late layers and contribute only K/V (or their Gated DeltaNet
    update), exact rows (the tail, selected rows) run the layers over them: the stock forward with the filled
    rows' late inputs replaced computes the same (`filled_reference`). Filled rows' late K/V: bitwise the
    stock layers' projections of x̂_l (identity: of x_S, DESIGN section 7); the rest within the kernel floor."""
    model, _ = tiny_model(family)
    ids, split, tail = prompt(), 3, 8
    stock = plain_prefill(model, ids)
    every_prefix_row = torch.arange(N - tail)
    arms = [(identity_fill, split_state, False), (scaled_fill, scaled_fill, True)]  # x_S, then x̂_S, at layer S
    for fill, predict, map_split in arms:
        plan = Plan(split=split, tail=tail, fill="identity" if fill is identity_fill else "ridge", map_split=map_split)
        for selected in (None, torch.tensor([0, 5, 17])):
            got = prefill(model, ids, plan, fill=fill, select=None if selected is None else lambda ctx, s=selected: s)
            want_exact = [*([] if selected is None else selected.tolist()), *range(N - tail, N)]
            assert got.exact_rows.tolist() == want_exact
            filled = torch.tensor([i for i in range(N) if i not in want_exact])
            logits, cache = reference(model, ids, split, filled, predict, map_split=map_split)
            assert (logits[:, -1] - stock.logits).abs().max() > 1e-2  # the fill matters at this tolerance
            assert_matches(got.cache, got.logits, cache, logits[:, -1], filled, split)
        # every prefix row selected exact: the fill is never read, and the arm is the stock model bitwise
        every = prefill(model, ids, plan, fill=fill, select=lambda ctx: every_prefix_row)
        assert every.exact_rows.tolist() == list(range(N)) and compare(every, stock) is None


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
    """nofill: late layers hold the exact rows only, and the stock model continues from that ragged cache.
    Reference: the stock forward over prompt and continuation whose late attention layers mask the filled
    rows' keys and whose late Gated DeltaNet layers scan the other rows only (`filled_reference`)."""
    model, _ = tiny_model(family)
    ids, tail, k = prompt(), 8, 5
    rf = RidgeFill(model, split=3, tail=tail, fill="nofill")
    result = rf.prefill(ids)
    assert result.ragged
    attn_late = [i for i, t in enumerate(getattr(model.config, "layer_types", None) or ["full_attention"] * 6)
                 if t == "full_attention" and i >= 3]
    for i in attn_late:
        assert result.cache.layers[i].keys.shape[2] == tail
    filled = torch.arange(N - tail)
    logits, cache = reference(model, ids, 3, filled, absent=True)
    assert (logits[:, -1] - plain_prefill(model, ids).logits).abs().max() > 1e-2
    assert_matches(result.cache, result.logits, cache, logits[:, -1], filled, 3, kept=torch.arange(N - tail, N))
    cont = prompt(k, seed=3)
    got = rf.extend(result, cont)
    logits, cache = reference(model, torch.cat([ids, cont], 1), 3, filled, absent=True)
    torch.testing.assert_close(got, logits[:, N:], rtol=0, atol=1e-4)
    assert_matches(result.cache, got[:, -1], cache, logits[:, -1], filled, 3, kept=torch.arange(N - tail, N + k),
                   bitwise=False, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next"])
def test_continuation_reads_the_filled_cache(tiny_model, family):
    """Continuation tokens after a filled prefill: the stock model reading the engine's cache gives the logits
    the stock model gives reading a cache built without the engine (the stock forward with the filled rows'
    late inputs replaced), at once or a token at a time."""
    model, _ = tiny_model(family)
    rf = RidgeFill(model, split=3, tail=8, fill="identity", map_split=False)
    ids, cont = prompt(), prompt(6, seed=4)
    filled = torch.arange(N - 8)
    _, by_hand = reference(model, ids, 3, filled, split_state)
    with torch.no_grad():
        want = model(input_ids=cont, cache=by_hand, use_cache=True, position_ids=torch.arange(N, N + 6)[None]).logits
    stock = plain_prefill(model, ids)
    with torch.no_grad():
        stock_cont = model(input_ids=cont, cache=stock.cache, use_cache=True).logits
    assert (want - stock_cont).abs().max() > 1e-2
    result = rf.prefill(ids)
    together = rf.extend(result, cont)
    torch.testing.assert_close(together, want, rtol=0, atol=1e-4)
    assert_matches(result.cache, together[:, -1], by_hand, want[:, -1], filled, 3, bitwise=False, atol=1e-4)
    result = rf.prefill(ids)
    one_by_one = torch.cat([rf.extend(result, cont[:, i : i + 1]) for i in range(6)], 1)
    torch.testing.assert_close(one_by_one, want, rtol=0, atol=1e-4)


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
        prefill(model, ids, Plan(split=0, tail=4, fill="nofill"), fill=AbsentRows())
    with pytest.raises(ValueError, match="unknown fill 'magic'; valid fills: exact, identity, kv_ridge, nofill, ridge"):
        fill_named("magic")  # names are the registry's: the engine takes strategies
    with pytest.raises(ValueError, match="fill 'ridge' has no fill function or strategy"):
        prefill(model, ids, Plan(split=3, tail=4, fill="ridge"))
    with pytest.raises(ValueError, match="needs a fill function"):
        fill_named("ridge").row_fill(None)
    with pytest.raises(ValueError, match="exact rows must lie in the prefix"):
        prefill(model, ids, Plan(split=3, tail=4, fill="nofill"), fill=AbsentRows(),
                select=lambda ctx: torch.tensor([N - 1]))
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
