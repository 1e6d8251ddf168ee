"""Selectors on tiny models: rows lie in the prefix, controls match counts, seeds reproduce,
the attention selector finds a hand-built dominant row, the probe's count is the base rules'."""

import pytest
import torch

from rf_eval.engine import Plan, prefill
from rf_eval.ridge.maps import identity_fill
from rf_eval.ridgefill.arm import prefill_arm
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.selectors import Attention, Probe, Request, make_selector

TAIL = 12
TEXT = ("<|im_start|>user\nThe Vault code of Blue-Falcon is 48213, kept by Ms Quill. "
        "Cats sleep all day.\nWhat is the Vault code of Blue-Falcon?<|im_end|>\n<|im_start|>assistant\n")
SELECTORS = [
    "attention(layers=3;window=8)", "question_hidden(layers=3;window=8)", "protected", "lexical_net",
    "special", "random(seed=1;of=attention(layers=3;window=8))", "probe(rows=16;layers=3;window=8)+special",
]


def ids_of(tokenizer, text=TEXT):
    return tokenizer(text, return_tensors="pt").input_ids


def unigram(tokenizer):
    """A fixed table: token id i was seen (i * 7) % 50 times."""
    return torch.tensor([(i * 7) % 50 for i in range(len(tokenizer))], dtype=torch.int64)


def arm(model, tokenizer, selector, fill="identity"):
    rf = RidgeFill(model, tokenizer, split=4, tail=TAIL, fill=fill, selector=selector)
    rf.resources["unigram"] = unigram(tokenizer)
    return rf


def run_selector(model, tokenizer, selector, ids, plan=None):
    """(request, selection) from running `selector` inside the engine."""
    plan = plan or Plan(split=4, tail=TAIL, fill="identity")
    sel = make_selector(selector) if isinstance(selector, str) else selector
    req = Request(model, tokenizer, ids, plan, identity_fill, {"unigram": unigram(tokenizer)})
    wanted = sel.captures(req)
    req.capture_start = {k: a for k, (a, _) in wanted.items()}
    out = {}

    def select(ctx):
        out["sel"] = sel.select(req.attach(ctx))
        return out["sel"]

    prefill(model, ids, plan, fill=identity_fill, select=select,
            capture={k: slice(a, b) for k, (a, b) in wanted.items()} or None)
    return req, out["sel"]


@pytest.mark.parametrize("family,specs", [("llama", SELECTORS), ("qwen3_5", SELECTORS[-2:])])
def test_selections_are_prefix_subsets(tiny_model, family, specs):
    model, tok = tiny_model(family)
    ids = ids_of(tok)
    n = ids.shape[1]
    for spec in specs:
        result = arm(model, tok, spec).prefill(ids)
        prefix = n - result.plan.tail
        chosen = result.exact_rows[result.exact_rows < prefix]
        assert result.plan.tail == TAIL, spec
        assert torch.equal(result.exact_rows[-TAIL:], torch.arange(prefix, n)), spec
        assert chosen.numel() == torch.unique(chosen).numel() and (chosen >= 0).all(), spec
        assert chosen.numel() > 0, spec


def test_count_matched_controls_and_seeds(tiny_model):
    model, tok = tiny_model("llama")
    ids = ids_of(tok)
    base = "attention(layers=3;window=8)"
    _, sel = run_selector(model, tok, base, ids)
    k = sel.rows.numel()
    assert k == round(0.1 * ids.shape[1])
    _, r1 = run_selector(model, tok, f"random(seed=1;of={base})", ids)
    _, r1b = run_selector(model, tok, f"random(seed=1;of={base})", ids)
    _, r2 = run_selector(model, tok, f"random(seed=2;of={base})", ids)
    assert r1.rows.numel() == r2.rows.numel() == k
    assert torch.equal(r1.rows, r1b.rows) and not torch.equal(r1.rows, r2.rows)
    longer = arm(model, tok, f"longer_tail(of={base})").prefill(ids)
    assert longer.plan.tail == TAIL + k and longer.exact_rows.numel() == TAIL + k
    assert torch.equal(longer.exact_rows, torch.arange(ids.shape[1] - TAIL - k, ids.shape[1]))


def test_special_tokens_are_added_on_top(tiny_model):
    model, tok = tiny_model("llama")
    ids = ids_of(tok)
    specials = {tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    prefix = ids.shape[1] - TAIL
    special_rows = [r for r in range(prefix) if int(ids[0, r]) in specials]
    assert special_rows[0] == 0 and len(special_rows) == 2  # <|im_start|> and the first <|im_end|>
    _, special = run_selector(model, tok, "special", ids)
    assert special.rows.tolist() == special_rows
    _, both = run_selector(model, tok, "random(seed=0;count=5)+special", ids)
    assert both.rows.numel() == 5 + len(special_rows)  # never overlapping: specials are on top
    assert set(special_rows) <= set(both.rows.tolist())


def test_attention_selector_picks_the_row_that_dominates_the_window(tiny_model):
    """Hand-built: row j's layer-3 key solves q_i . k_j = 40 / scale for every window query i."""
    model, tok = tiny_model("llama")
    ids = torch.randint(0, 200, (1, 64), generator=torch.Generator().manual_seed(5))
    n, j, window = 64, 10, 4
    sel = Attention(share=0.05, window=window, layers=(3,))
    plan = Plan(split=4, tail=TAIL, fill="identity")
    req = Request(model, tok, ids, plan, identity_fill)
    req.capture_start = {3: n - window}
    out = {}

    def select(ctx):
        req.attach(ctx)
        layer = model.model.layers[3]
        attn = layer.self_attn
        h = layer.input_layernorm(req.lower_input(3, n - window, n))
        q, _ = ctx.family.query(attn, h, ctx.inputs.cos[:, n - window :], ctx.inputs.sin[:, n - window :])
        keys = ctx.cache.layers[3].keys
        group = q.shape[1] // keys.shape[1]
        for g in range(keys.shape[1]):
            Q = q[0, g * group : (g + 1) * group].reshape(-1, q.shape[-1])  # (group * window, D)
            target = torch.full((Q.shape[0], 1), 40.0 / attn.scaling)
            keys[0, g, j] = (torch.linalg.pinv(Q) @ target)[:, 0]
        out["scores"] = sel.scores(req)
        out["rows"] = sel.select(req).rows
        return out["rows"]

    prefill(model, ids, plan, fill=identity_fill, select=select, capture={3: slice(n - window, n)})
    assert int(out["scores"][: n - TAIL].argmax()) == j
    assert out["scores"][j] > 0.95 * window * model.config.num_attention_heads
    assert j in out["rows"].tolist() and out["rows"].numel() == round(0.05 * n)


def test_probe_count_equals_base_rules_count(tiny_model):
    """Hand-built prompt over the byte tokenizer: the base rules' union counted independently."""
    model, tok = tiny_model("qwen3_5")
    text = "Zeta 7 Kappa x9 Delta 42 omega Tau. " * 2 + "Tau Kappa holds 42 and x9 now. Which Kappa holds 42?"
    ids = ids_of(tok, text)
    prefix = ids.shape[1] - TAIL
    counts = unigram(tok)
    chars = [tok.decode([int(i)]) for i in ids[0]]
    # protected-class matches among prefix rows: capitals, and letters after a letter or digit
    eligible = [r for r in range(prefix) if chars[r].isalpha()
                and (chars[r].isupper() or (r > 0 and chars[r - 1].isalnum()))]
    eligible.sort(key=lambda r: (int(counts[ids[0, r]]) + 1, r))
    rarer_half = set(eligible[: round(0.5 * len(eligible))])
    digits = {r for r in range(prefix) if chars[r].isdigit()}
    attention = Attention(share=0.2, window=8, layers=(3,), share_of="prefix")
    _, att = run_selector(model, tok, attention, ids)
    assert att.rows.numel() == round(0.2 * prefix)
    expected = len(rarer_half | digits | set(att.rows.tolist()))

    probe = Probe(rows=16, window=8, layers=(3,))
    req, got = run_selector(model, tok, probe, ids)
    assert probe.budget_count(req) == probe.count(req) == expected
    assert got.rows.numel() == expected
    assert (got.rows < prefix).all()
    lexical = probe.lexical.select(req).rows
    assert lexical.numel() > 0 and set(lexical.tolist()) <= set(got.rows.tolist())
    assert lexical.numel() <= int(0.05 * prefix)
    half = Probe(rows=16, window=8, layers=(3,), budget=0.5)
    _, fewer = run_selector(model, tok, half, ids)
    assert fewer.rows.numel() == round(0.5 * expected)


@pytest.mark.parametrize("family", ["llama", "qwen3_5", "gpt_oss", "gemma3"])  # sinks; sliding windows
def test_probe_shares_its_filled_kv_with_the_engine(tiny_model, family, monkeypatch):
    """The probe arm (filled K/V computed once, in the probe) = the engine given the probe's rows (computed anew)."""
    import rf_eval.engine as engine
    from rf_eval.cli.check_equivalence import cache_tensors

    model, tok = tiny_model(family)
    ids = ids_of(tok)
    prefix = ids.shape[1] - 24
    fill = lambda layer, x: x * (1.0 + 0.05 * layer)  # noqa: E731  (a non-identity fill)
    rf = RidgeFill(model, tok, split=4, tail=24, fill="identity", selector="probe(rows=16;layers=3;window=8)")
    rf.resources["unigram"] = unigram(tok)
    seen = {}
    real_late = engine.late_layers

    def spy(*args, **kwargs):
        seen["shared"], seen["layers"] = args[-1], sorted(args[-1].kv)
        return real_late(*args, **kwargs)

    monkeypatch.setattr(engine, "late_layers", spy)
    shared = prefill_arm(model, tok, rf.arm, ids, rf.arm.plan, rf.arm.fill_obj.row_fill(fill), resources=rf.resources)
    monkeypatch.undo()
    family_ = engine.family_for(model.config)
    attention = [i for i, layer in enumerate(engine.decoder_layers(model)) if i >= 4 and not family_.is_recurrent(layer)]
    assert seen["layers"] == attention and seen["shared"].rows == prefix
    assert seen["shared"].kv == {}  # the engine took every shared layer instead of computing its filled rows
    rows = shared.exact_rows[shared.exact_rows < prefix]
    fresh = prefill(model, ids, rf.arm.plan, fill=fill, select=lambda ctx: rows)
    assert torch.equal(fresh.exact_rows, shared.exact_rows)
    torch.testing.assert_close(shared.logits, fresh.logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(cache_tensors(shared.cache), cache_tensors(fresh.cache)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
