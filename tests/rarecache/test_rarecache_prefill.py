"""RaReCache prefill through the partial-prefill engine: the exact and pure-mapped ends, budgets, selectors."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from rf_eval import engine
from rf_eval.families import registered_families
from rf_eval.rarecache.features import cache_entries, prefill_cache, unsupported
from rf_eval.rarecache.maps import SIDES
from rf_eval.rarecache.method import RaReCache
from rf_eval.selectors.registry import names_for
from rf_eval.testing import tiny_config

SELECTORS = names_for("rarecache")

FAMILIES = tuple(name for name in registered_families() if unsupported(tiny_config(name, 259)) is None)  # KV caches


def make(fitted, family, **kw) -> RaReCache:
    f = fitted(family)
    return RaReCache(f["target"], f["tokenizer"], source=f["source"], maps=f["maps"], source_tokenizer=f["tokenizer"], **kw)


def mapped_for(rc: RaReCache, ids: torch.Tensor):
    keys, values = cache_entries(rc.source, rc.source_family, prefill_cache(rc.source, ids))
    return rc.mapper.map_prompt(dict(zip(SIDES, (keys, values))))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("selector", ["rank", "random-positions", "layer-prefix"])
def test_rho_one_is_bitwise_the_target(fitted, prompt, family, selector):
    rc = make(fitted, family, rho=1.0, selector=selector)
    target = rc.target
    got = rc.prefill(prompt)
    with torch.no_grad():
        cache = DynamicCache(config=target.config)
        want = target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    assert torch.equal(got.logits, want)
    for a, b in zip(got.cache.layers, cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    out = rc.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, target.generate(prompt, max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_rho_zero_decodes_from_the_pure_mapped_cache(fitted, prompt, family):
    rc = make(fitted, family, rho=0.0)
    target = rc.target
    n = prompt.shape[1]
    mapped = mapped_for(rc, prompt)
    got = rc.prefill(prompt)
    assert got.exact_rows.tolist() == [n - 1]  # only the last prompt row runs the target
    for layer, cached in enumerate(got.cache.layers):
        assert torch.equal(cached.keys[:, :, : n - 1], mapped.keys[layer][:, :, : n - 1])
        assert torch.equal(cached.values[:, :, : n - 1], mapped.values[layer][:, :, : n - 1])
    # The stock target reading the mapped cache of rows 0..n-2, fed the last token as a decoding step.
    stock = DynamicCache(config=target.config)
    for layer in range(len(got.cache.layers)):
        stock.update(mapped.keys[layer][:, :, : n - 1], mapped.values[layer][:, :, : n - 1], layer)
    with torch.no_grad():
        want = target(input_ids=prompt[:, -1:], cache=stock, use_cache=True,
                      position_ids=torch.tensor([[n - 1]])).logits[:, -1]
    torch.testing.assert_close(got.logits, want, rtol=1e-4, atol=1e-4)
    # Generation: same mapped cache, then the stock generate.
    stock = DynamicCache(config=target.config)
    for layer in range(len(got.cache.layers)):
        stock.update(mapped.keys[layer][:, :, : n - 1], mapped.values[layer][:, :, : n - 1], layer)
    want_tokens = target.generate(prompt, cache=stock, max_new_tokens=6, do_sample=False)
    assert torch.equal(rc.generate(prompt, max_new_tokens=6, do_sample=False), want_tokens)
    assert not torch.equal(got.logits, engine.plain_prefill(target, prompt).logits)


@pytest.mark.parametrize("selector", [s for s in SELECTORS if s != "layer-prefix"])
def test_budget_is_ceil_rho_t_with_the_last_row_counted(fitted, prompt, selector):
    n = prompt.shape[1]
    for rho in (0.1, 0.3, 0.5):
        rc = make(fitted, "llama", rho=rho, selector=selector, seed=3)
        result = rc.prefill(prompt)
        rows = result.exact_rows.tolist()
        assert len(rows) == math.ceil(rho * n - 1e-9) and rows[-1] == n - 1
        mapped = mapped_for(rc, prompt)
        filled = sorted(set(range(n)) - set(rows))
        for layer, cached in enumerate(result.cache.layers):  # filled rows hold the mapped entries
            assert torch.equal(cached.keys[:, :, filled], mapped.keys[layer][:, :, filled])
        assert not torch.equal(result.cache.layers[1].keys[:, :, rows], mapped.keys[1][:, :, rows])


def test_rank_selector_takes_the_highest_scores(fitted, prompt):
    rc = make(fitted, "llama", rho=0.3)
    score = mapped_for(rc, prompt).score[:-1]
    rows = rc.prefill(prompt).exact_rows[:-1]
    chosen = score[rows]
    others = score[[i for i in range(score.numel()) if i not in set(rows.tolist())]]
    assert chosen.min() >= others.max()


def test_random_selector_is_seeded_and_reproducible(fitted, prompt):
    a = make(fitted, "llama", rho=0.3, selector="random-positions", seed=1).prefill(prompt).exact_rows
    b = make(fitted, "llama", rho=0.3, selector="random-positions", seed=1).prefill(prompt).exact_rows
    c = make(fitted, "llama", rho=0.3, selector="random-positions", seed=2).prefill(prompt).exact_rows
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_layer_prefix_recomputes_the_first_layers_for_every_row(fitted, prompt):
    rc = make(fitted, "llama", rho=0.3, selector="layer-prefix")  # ceil(0.3 * 6) = 2 layers
    n = prompt.shape[1]
    got = rc.prefill(prompt)
    plain = engine.plain_prefill(rc.target, prompt)
    mapped = mapped_for(rc, prompt)
    for layer in range(6):
        cached = got.cache.layers[layer]
        if layer < 2:
            assert torch.equal(cached.keys, plain.cache.layers[layer].keys)
        else:
            assert torch.equal(cached.keys[:, :, : n - 1], mapped.keys[layer][:, :, : n - 1])
    assert rc.provenance()["recomputes"].startswith("layer-prefix")


@pytest.mark.parametrize("selector", ["rank", "random-positions", "layer-prefix", "oracle-l2"])
def test_generation_prefill_gives_rows_the_same_classes(fitted, prompt, selector):
    """prefill(ids[:-1], for_generation) = the full-prompt prefill's cache without its last row."""
    rc = make(fitted, "qwen3", rho=0.3, selector=selector)
    full = rc.prefill(prompt)
    short = rc.prefill(prompt[:, :-1], for_generation=True)
    n = prompt.shape[1]
    for a, b in zip(full.cache.layers, short.cache.layers):
        assert b.keys.shape[2] == n - 1
        torch.testing.assert_close(a.keys[:, :, : n - 1], b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values[:, :, : n - 1], b.values, rtol=1e-5, atol=1e-5)


def test_oracles_are_labelled(fitted):
    for selector in SELECTORS:
        info = make(fitted, "llama", selector=selector).provenance()
        assert info["oracle"] == selector.startswith("oracle")
        assert info["maps_sha256"] and info["maps_metadata"]["k"] == "2"


def test_provenance_has_every_methods_identity_schema(fitted):
    """One schema (`rf_eval.method.model_identity`): RaReCache records the target as RidgeFill records its
    model, with the weights fingerprint `stats.comparable` compares arms by, and the source beside it."""
    from rf_eval.integrity.weights import weights_fingerprint
    from rf_eval.ridgefill.method import RidgeFill

    f = fitted("llama")
    info = make(fitted, "llama").provenance()
    ridge = RidgeFill(f["target"], f["tokenizer"], fill="identity", split=2).provenance()
    shared = {"method", "model_type", "model_name", "weights_sha256"}
    assert shared <= set(ridge) and shared | {"maps_sha256", "maps_metadata"} <= set(info)
    assert info["weights_sha256"] == ridge["weights_sha256"] == weights_fingerprint(f["target"])
    assert info["source_weights_sha256"] == weights_fingerprint(f["source"]) != info["weights_sha256"]
    assert (info["model_name"], info["model_type"]) == (ridge["model_name"], ridge["model_type"])
