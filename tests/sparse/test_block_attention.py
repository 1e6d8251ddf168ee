"""The block-sparse prefill attention (issue #56 item 1): the FlexAttention path equals a dense masked
attention written here (fp32, 1e-5), only the kept blocks are scheduled, and a pattern that keeps every
block is the stock model, bitwise."""

from __future__ import annotations

import types

import pytest
import torch

from rf_eval.engine import plain_prefill
from rf_eval.sparse.attention import block_sparse_attention, sparse_prefill
from rf_eval.sparse.blocks import block_mask, computed_pairs, density

H, HKV, D, BLOCK = 4, 2, 16, 16


def random_pattern(n: int, seed: int, heads: int = H) -> torch.Tensor:
    b = -(-n // BLOCK)
    return torch.rand(heads, b, b, generator=torch.Generator().manual_seed(seed)) < 0.4


def dense_reference(q, k, v, keep, scale):
    """softmax(q k^T * scale) v over the pairs j <= i whose blocks (i // BLOCK, j // BLOCK) are kept or on the
    diagonal, per head; keys and values shared by each group of H / HKV query heads."""
    n = q.shape[2]
    rows = torch.arange(n)
    qb, kb = rows[:, None] // BLOCK, rows[None, :] // BLOCK
    k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        allowed = (rows[None, :] <= rows[:, None]) & (keep[h][qb, kb] | (qb == kb))
        scores = (q[0, h] @ k[0, h].T * scale).masked_fill(~allowed, float("-inf"))
        out[0, h] = scores.softmax(-1) @ v[0, h]
    return out


@pytest.mark.parametrize("n", [100, 128, 203])
def test_the_sparse_path_equals_a_dense_masked_reference(n):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, heads, n, D, generator=g) for heads in (H, HKV, HKV))
    keep = random_pattern(n, n)
    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=H // HKV, is_causal=True)
    with sparse_prefill(types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="sdpa")),
                        lambda layer, query, key: (keep, BLOCK)):
        out, _ = block_sparse_attention(module, q, k, v, None, scaling=D**-0.5)
    want = dense_reference(q, k, v, keep, D**-0.5).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


def test_only_the_kept_blocks_are_scheduled_and_counted():
    """The mask FlexAttention runs holds exactly the kept blocks on or below the diagonal (each diagonal block
    always), and the pairs counted are those of a loop over every (query, key) pair."""
    n = 90
    keep = random_pattern(n, 3)
    blocks = block_mask(keep, n, BLOCK).to_dense()[0].bool()  # (H, blocks, blocks) scheduled
    b = keep.shape[-1]
    for h in range(H):
        for i in range(b):
            for j in range(b):
                assert bool(blocks[h, i, j]) == (j == i or (j < i and bool(keep[h, i, j]))), (h, i, j)
    pairs = [sum(1 for i in range(n) for j in range(i + 1) if i // BLOCK == j // BLOCK or keep[h, i // BLOCK, j // BLOCK])
             for h in range(H)]
    assert computed_pairs(keep, n, BLOCK).tolist() == pairs
    assert density(keep, n, BLOCK) == pytest.approx(sum(pairs) / H / (n * (n + 1) / 2))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_block_kept_is_the_stock_model_bitwise(family, tiny):
    """Through the attention interface, a layer whose pattern keeps every causal block runs the stock call:
    the prefill's logits and cache equal the unmodified model's, bitwise."""
    model = tiny[family][0]
    ids = torch.randint(0, 250, (1, 150), generator=torch.Generator().manual_seed(1))
    asked = []

    def everything(layer, query, key):
        asked.append(layer)
        b = -(-query.shape[2] // BLOCK)
        return torch.ones(query.shape[1], b, b, dtype=torch.bool), BLOCK

    with sparse_prefill(model, everything), torch.no_grad():
        sparse = plain_prefill(model, ids)
    stock = plain_prefill(model, ids)
    assert asked == list(range(model.config.num_hidden_layers))
    assert torch.equal(sparse.logits, stock.logits)
    for a, b in zip(sparse.cache.layers, stock.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_no_prompt_pays_for_the_kernels_compilation(tiny):
    """The method compiles its kernel when it is built (`attention.warm`), so a timed prefill at any length
    compiles nothing: the measured speedup of a run's first item is not a compilation's."""
    from torch._dynamo.utils import counters

    from rf_eval.sparse.xattention import XAttention

    method = XAttention(tiny["llama"][0], None, block=BLOCK, stride=4, threshold=0.5)
    graphs = counters["stats"]["unique_graphs"]
    for n in (150, 233, 97):
        method.prefill(torch.randint(0, 250, (1, n), generator=torch.Generator().manual_seed(n)))
    assert counters["stats"]["unique_graphs"] == graphs
