"""The fixed-pattern control (issue #56 item 4): sink blocks and a local window, its blocks the rule written
here, its prefill the model under a dense mask of those blocks, its MACs a count written here, and a budget
that sets its window."""

from __future__ import annotations

import pytest
import torch
from test_block_attention import dense_reference

import rf_eval.sparse.attention as attention
from rf_eval.cost.mac_model import prefill_macs
from rf_eval.sparse.sinkwindow import SinkWindow

N, BLOCK = 150, 16


def prompt(n=N, seed=0):
    return torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(seed))


def rule(n: int, sink: int, window: int) -> torch.Tensor:
    """Query block i keeps key block j when j < sink or i - window <= j, and j <= i."""
    b = -(-n // BLOCK)
    keep = torch.zeros(b, b, dtype=torch.bool)
    for i in range(b):
        for j in range(i + 1):
            keep[i, j] = j < sink or j >= i - window
    return keep


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "qwen3_next"])
def test_the_prefill_is_the_model_under_a_dense_mask_of_the_rule(family, tiny, monkeypatch):
    """On hybrid models (Gemma 3's sliding-window layers, Qwen3-Next's linear attention) only the
    full-attention layers take the pattern; the others run their own."""
    model = tiny[family][0]
    ids = prompt()
    method = SinkWindow(model, None, block=BLOCK, sink=1, window=2)
    sparse = method.prefill(ids)
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * model.config.num_hidden_layers
    assert sorted(sparse.attention.pairs) == [i for i, kind in enumerate(types) if kind == "full_attention"]
    keep = rule(N, 1, 2)

    def dense(q, k, v, block_mask, scale, enable_gqa):
        assert torch.equal(block_mask.to_dense()[0, 0].bool(), keep)  # the blocks the kernel was handed
        return dense_reference(q, k, v, keep.expand(q.shape[1], -1, -1), scale)

    monkeypatch.setattr(attention, "_flex", lambda: dense)
    reference = method.prefill(ids)
    torch.testing.assert_close(sparse.logits, reference.logits, rtol=0, atol=1e-5)
    for a, b in zip(sparse.cache.layers, reference.cache.layers):
        if hasattr(a, "keys"):  # an attention layer's cache (a linear-attention layer holds its state)
            torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-5)
    stock = model(input_ids=ids, logits_to_keep=1).logits[:, -1]
    assert (sparse.logits - stock).abs().max() > 1e-3  # the pattern changed the prefill


def test_its_macs_are_a_count_written_here(tiny):
    """Exact's MACs less, in each of the L layers, 2 x heads x head_dim per (query, key) pair not computed,
    the pairs counted one by one."""
    model = tiny["llama"][0]
    cfg = model.config
    method = SinkWindow(model, None, block=BLOCK, sink=1, window=2)
    keep = rule(N, 1, 2)
    computed = sum(1 for i in range(N) for j in range(i + 1) if keep[i // BLOCK, j // BLOCK])
    skipped = N * (N + 1) // 2 - computed
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    want = prefill_macs(cfg, N) - cfg.num_hidden_layers * 2 * cfg.num_attention_heads * head_dim * skipped
    cost = method.prefill_cost(N, method.prefill(prompt()))
    assert cost.prefill_macs == want and cost.exact_macs == prefill_macs(cfg, N)
    assert cost.attention_density == pytest.approx(computed / (N * (N + 1) / 2))
    assert cost.fields()["cache_fraction"] == 1.0 and cost.exact_rows == N
    assert method.prefill_cost(N).prefill_macs == want  # the preview: the pattern is known before the prompt
    assert method.speedup_ceilings(N) == {"mac_ceiling": cost.mac_speedup}


def test_a_budget_sets_the_widest_window_within_it(tiny):
    model = tiny["llama"][0]
    method = SinkWindow(model, None, block=BLOCK, budget=0.95)
    plan = method.plan(N)
    cost = method.prefill_cost(N, method.prefill(prompt()), plan)
    assert cost.macs_fraction <= 0.95 and cost.budget == 0.95 and cost.knob_value == plan.setting
    wider = SinkWindow(model, None, block=BLOCK, window=plan.setting + 1)
    assert wider.prefill_cost(N).macs_fraction > 0.95


def test_a_window_over_every_block_is_the_stock_prefill_bitwise(tiny):
    model = tiny["llama"][0]
    method = SinkWindow(model, None, block=BLOCK, window=N)
    assert method.plan(N).plain
    assert torch.equal(method.prefill(prompt()).logits, model(input_ids=prompt(), logits_to_keep=1).logits[:, -1])
