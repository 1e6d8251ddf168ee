"""Prompts of one length through the engine together: each prompt's result is the one it gets alone."""

import pytest
import torch

from rf_eval.cli.check_equivalence import cache_tensors, compare
from rf_eval.engine import AbsentRows, Plan, extend, prefill, split_batch
from rf_eval.families import family_for
from rf_eval.ridge.maps import identity_fill
from rf_eval.testing import FAMILIES

N, B, TAIL = 48, 3, 16  # 16 exact rows: past BLAS's small-matrix kernels (rf_eval.engine.batch)


def scaled_fill(layer, x):
    return x * (1.0 + 0.05 * layer)


def prompts(b=B, n=N, seed=0):
    return torch.randint(0, 250, (b, n), generator=torch.Generator().manual_seed(seed))


CASES = [
    (Plan(split=2, tail=TAIL, fill="ridge"), scaled_fill),
    (Plan(split=3, tail=TAIL, fill="identity", map_split=True, chunk_size=20), identity_fill),
    (Plan(split=2, tail=TAIL, fill="nofill"), AbsentRows()),
]


def assert_same(got, alone, moe):
    """Bitwise on dense families; within rounding where experts see the batch's tokens together, or where a
    Gated DeltaNet layer's scan carries its state into the next chunk of the lower layers (`moe` True for
    both: on AVX-512 CPUs the scan's batched matmuls round by batch size)."""
    if not moe:
        assert compare(got, alone) is None
        return
    torch.testing.assert_close(got.logits, alone.logits, rtol=0, atol=1e-5)
    for x, y in zip(cache_tensors(got.cache), cache_tensors(alone.cache), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_prompt_of_a_batch_gets_its_own_prefill_and_decodes_from_its_own_cache(tiny_model, family):
    model, _ = tiny_model(family)
    moe = family_for(model.config).moe_mlp
    ids = prompts()
    nxt = prompts(B, 3, seed=1)
    for plan, fill in CASES:
        together = split_batch(prefill(model, ids, plan, fill=fill))
        assert len(together) == B and together[0].timings["batch"] == B
        alone = [prefill(model, ids[b : b + 1], plan, fill=fill) for b in range(B)]
        rounds = moe or (family_for(model.config).linear_attention and plan.chunk_size is not None)
        for got, one in zip(together, alone):
            assert all(t.shape[0] == 1 for t in cache_tensors(got.cache))  # a batch-1 cache of the model's type
            assert_same(got, one, rounds)
        if together[0].ragged and model.config._attn_implementation == "eager":
            continue  # a ragged cache (nofill) does not decode under eager attention, batched or not; arms
            # refuse it there (rf_eval.fills.base.check_ragged_cache). GPT-OSS's sinks need eager
        for b in range(B):  # each split cache decodes on its own, and decoding one leaves the others as they were
            got, one = extend(model, together[b], nxt[b : b + 1]), extend(model, alone[b], nxt[b : b + 1])
            torch.testing.assert_close(got, one, rtol=0, atol=1e-5 if rounds else 0)


@pytest.mark.parametrize("plan, select, says", [
    (Plan(split=2, tail=TAIL, fill="ridge"), lambda ctx: torch.zeros(0, dtype=torch.long), "selector or hooks"),
    (Plan(split=2, tail=N, fill="ridge"), None, "no filled row"),
    (Plan(split=2, tail=TAIL, fill="exact"), None, "no filled row"),
])
def test_a_batch_the_engine_cannot_run_together_is_refused(tiny_model, plan, select, says):
    model, _ = tiny_model("llama")
    with pytest.raises(ValueError, match=says):
        prefill(model, prompts(), plan, fill=scaled_fill, select=select)
