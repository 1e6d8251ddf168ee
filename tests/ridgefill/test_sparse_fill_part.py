"""`fill=...,sparse=METHOD(...)` (issue #56 item 6): one RidgeFill arm whose exact layers run a sparse-attention
method's pattern. Its lower layers' caches are that method's, bitwise; its late layers' exact rows attend as a
dense masked reference written here over the kept blocks; a pattern that keeps every block is the fill alone,
bitwise; its MACs are the fill's less every sparse layer's skipped pairs (counted here); a shared lower-layer
pass is never read across a sparse and a stock arm; bad parts are refused naming the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rf_eval.engine.shared_rows import shared_rows
from rf_eval.fields import ArmError
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.sparse.attention import attend_kept_blocks
from rf_eval.sparse.sinkwindow import SinkWindow

N, SPLIT, BLOCK, LAYERS, TAIL = 200, 3, 16, 6, 32
SPARSE = f"sinkwindow(block={BLOCK};window=1)"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from rf_eval.testing import make_tiny_model

    return AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path_factory.mktemp("sl"), seed=0)).eval()


def prompt(seed=0):
    return torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(seed))


def test_the_lower_layers_are_the_sparse_methods_own_bitwise(model):
    combined = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL, sparse=SPARSE).prefill(prompt())
    alone = SinkWindow(model, None, block=BLOCK, window=1).prefill(prompt())
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL).prefill(prompt())
    assert sorted(combined.attention.pairs) == list(range(LAYERS))  # the lower layers, then the late ones' tail
    assert sorted(combined.attention.causal) == list(range(SPLIT, LAYERS))
    for i in range(SPLIT):
        assert torch.equal(combined.cache.layers[i].keys, alone.cache.layers[i].keys)
        assert torch.equal(combined.cache.layers[i].values, alone.cache.layers[i].values)
    assert not torch.equal(combined.cache.layers[SPLIT].keys, plain.cache.layers[SPLIT].keys)


def test_a_pattern_that_keeps_every_block_is_the_fill_alone_bitwise(model):
    everything = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL, sparse=f"sinkwindow(block={BLOCK};window={N})")
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL)
    a, b = everything.prefill(prompt()), plain.prefill(prompt())
    assert torch.equal(a.logits, b.logits) and a.attention is None
    assert everything.prefill_cost(N, a) == plain.prefill_cost(N, b)


def test_a_pattern_run_that_keeps_every_block_is_the_engines_attention_bitwise(model, monkeypatch):
    """A sparse prompt (not planned dense) whose pattern keeps every causal block in every layer: the lower
    layers run the stock attention and the late layers the engine's own, so the arm is the fill alone."""
    from rf_eval.sparse.blocks import causal_blocks
    from rf_eval.sparse.method import Choice

    monkeypatch.setattr(SinkWindow, "pattern", lambda self, layer, query, key, plan: Choice(
        causal_blocks(query.shape[2], BLOCK).expand(query.shape[1], -1, -1)))
    combined = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL, sparse=SPARSE).prefill(prompt())
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL).prefill(prompt())
    assert torch.equal(combined.logits, plain.logits)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(combined.cache.layers, plain.cache.layers))
    assert combined.attention.pairs[LAYERS - 1] == combined.attention.causal[LAYERS - 1]


def kept(i: int, j: int) -> bool:
    """The sink-and-window pattern written out: query row i reads key row j <= i when j's block is the first
    one or no more than one block before i's."""
    return j <= i and (j // BLOCK < 1 or j // BLOCK >= i // BLOCK - 1)


def test_its_macs_are_the_fills_less_every_sparse_layers_skipped_pairs(model):
    cfg = model.config
    arm = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL, sparse=SPARSE)
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL)
    cost, fill_cost = arm.prefill_cost(N, arm.prefill(prompt())), plain.prefill_cost(N, plain.prefill(prompt()))
    lower = sum(kept(i, j) for i in range(N) for j in range(N))  # every row, in each lower layer
    tail_rows = range(N - TAIL, N)
    late = sum(kept(i, j) for i in tail_rows for j in range(N))  # the tail's rows, in each late layer
    late_causal = sum(i + 1 for i in tail_rows)
    per_pair = 2 * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    skipped = SPLIT * (N * (N + 1) // 2 - lower) + (LAYERS - SPLIT) * (late_causal - late)
    assert cost.prefill_macs == fill_cost.prefill_macs - per_pair * skipped
    assert cost.attention_density == pytest.approx((SPLIT * lower + (LAYERS - SPLIT) * late)
                                                   / (SPLIT * N * (N + 1) / 2 + (LAYERS - SPLIT) * late_causal))
    assert fill_cost.attention_density is None and cost.exact_rows == fill_cost.exact_rows
    assert arm.speedup_ceilings(N) == {} and plain.speedup_ceilings(N)  # the pattern is known once the prompt ran


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (3, 3)])
def test_the_late_rows_attend_as_a_dense_masked_reference_over_the_kept_blocks(heads, kv_heads):
    """`attend_kept_blocks` against softmax(q k^T * scale) with every pair outside a kept block or above the
    diagonal masked, computed densely here (fp32, 1e-5), for scattered rows and a short last block."""
    n, block, dim = 150, 16, 8
    g = torch.Generator().manual_seed(0)
    q_all = torch.randn(1, heads, n, dim, generator=g)
    k, v = (torch.randn(1, kv_heads, n, dim, generator=g) for _ in range(2))
    rows = torch.tensor([3, 17, 40, 41, 90, *range(120, n)])
    blocks = -(-n // block)
    keep = torch.rand(heads, blocks, blocks, generator=g) < 0.4
    out, pairs = attend_kept_blocks(q_all[:, :, rows], k, v, rows, keep, block, 0.3)
    i, j = rows[:, None], torch.arange(n)[None, :]
    expected, counted = [], 0
    for h in range(heads):
        mask = (j <= i) & (keep[h][i // block, j // block] | (i // block == j // block))
        counted += int(mask.sum())
        kv = h // (heads // kv_heads)
        scores = (q_all[0, h, rows] @ k[0, kv].T * 0.3).masked_fill(~mask, float("-inf"))
        expected.append(scores.softmax(-1) @ v[0, kv])
    torch.testing.assert_close(out, torch.stack(expected, 1).reshape(1, len(rows), -1), rtol=0, atol=1e-5)
    assert pairs == counted / heads


def test_a_shared_lower_pass_is_not_read_across_sparse_and_stock_arms(model):
    """Inside a block of shared passes (`rf-eval demo`'s arms), the stock arm after a sparse one of the same
    split computes what it computes alone."""
    sparse = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL, sparse=SPARSE)
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=TAIL)
    alone = plain.prefill(prompt()).logits
    with shared_rows():
        sparse.prefill(prompt())
        assert torch.equal(plain.prefill(prompt()).logits, alone)


@pytest.mark.parametrize("fields, says", [
    ({"fill": "identity", "sparse": "gemfilter"}, "'gemfilter' is not a sparse-attention method; valid: flexprefill"),
    ({"fill": "identity", "sparse": "xattention(stride=5)"}, "stride=5: give a stride >= 1 that divides block=128"),
    ({"fill": "identity", "sparse": "flexprefill(gamma=2)"}, "gamma=2"),
    ({"fill": "identity", "sparse": "sinkwindow(budget=0.5)"}, "takes no budget: the arm's own budget= sets"),
    ({"fill": "identity", "sparse": "sinkwindow+xattention"}, "sparse names one method"),
    ({"fill": "exact", "sparse": "sinkwindow"}, "fill=exact with sparse=sinkwindow is method=sinkwindow"),
])
def test_bad_sparse_parts_are_refused(fields, says):
    with pytest.raises(ArmError, match=says):
        RidgeFillArm.from_fields(fields)
