"""`fill=...,sparse=METHOD(...)` (issue #56 item 6): one RidgeFill arm whose lower layers run a sparse-attention
method's pattern. Its lower layers' caches are that method's, bitwise; a pattern that keeps every block is the
fill alone, bitwise; its MACs are the fill's less the lower layers' skipped pairs (counted here); a shared
lower-layer pass is never read across a sparse and a stock arm; bad parts are refused naming the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rf_eval.engine.shared_rows import shared_rows
from rf_eval.fields import ArmError
from rf_eval.ridgefill.arm_spec import RidgeFillArm
from rf_eval.ridgefill.method import RidgeFill
from rf_eval.sparse.sinkwindow import SinkWindow

N, SPLIT, BLOCK = 200, 3, 16
SPARSE = f"sinkwindow(block={BLOCK};window=1)"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from rf_eval.testing import make_tiny_model

    return AutoModelForCausalLM.from_pretrained(make_tiny_model("llama", tmp_path_factory.mktemp("sl"), seed=0)).eval()


def prompt(seed=0):
    return torch.randint(0, 250, (1, N), generator=torch.Generator().manual_seed(seed))


def test_the_lower_layers_are_the_sparse_methods_own_bitwise(model):
    combined = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32, sparse=SPARSE).prefill(prompt())
    alone = SinkWindow(model, None, block=BLOCK, window=1).prefill(prompt())
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32).prefill(prompt())
    assert sorted(combined.attention.pairs) == list(range(SPLIT))
    for i in range(SPLIT):
        assert torch.equal(combined.cache.layers[i].keys, alone.cache.layers[i].keys)
        assert torch.equal(combined.cache.layers[i].values, alone.cache.layers[i].values)
    assert not torch.equal(combined.cache.layers[SPLIT].keys, plain.cache.layers[SPLIT].keys)


def test_a_pattern_that_keeps_every_block_is_the_fill_alone_bitwise(model):
    everything = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32, sparse=f"sinkwindow(block={BLOCK};window={N})")
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32)
    a, b = everything.prefill(prompt()), plain.prefill(prompt())
    assert torch.equal(a.logits, b.logits) and a.attention is None
    assert everything.prefill_cost(N, a) == plain.prefill_cost(N, b)


def test_its_macs_are_the_fills_less_the_lower_layers_skipped_pairs(model):
    cfg = model.config
    arm = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32, sparse=SPARSE)
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32)
    cost, fill_cost = arm.prefill_cost(N, arm.prefill(prompt())), plain.prefill_cost(N, plain.prefill(prompt()))
    # query block i keeps key block j when j < 1 (the sink) or j >= i - 1 (the window), causal pairs counted
    computed = sum(1 for i in range(N) for j in range(i + 1) if j // BLOCK < 1 or j // BLOCK >= i // BLOCK - 1)
    per_pair = 2 * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert cost.prefill_macs == fill_cost.prefill_macs - SPLIT * per_pair * (N * (N + 1) // 2 - computed)
    assert cost.attention_density == pytest.approx(computed / (N * (N + 1) / 2))
    assert fill_cost.attention_density is None and cost.exact_rows == fill_cost.exact_rows
    assert arm.speedup_ceilings(N) == {} and plain.speedup_ceilings(N)  # the pattern is known once the prompt ran


def test_a_shared_lower_pass_is_not_read_across_sparse_and_stock_arms(model):
    """Inside a block of shared passes (`rf-eval demo`'s arms), the stock arm after a sparse one of the same
    split computes what it computes alone."""
    sparse = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32, sparse=SPARSE)
    plain = RidgeFill(model, None, fill="identity", split=SPLIT, tail=32)
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
