"""RaReCache's selectors (`rf_eval.selectors.mapped_cache`): the attention score against the stock model's
own attention weights, and the positions each selector picks from a prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rf_eval.families import family_for
from rf_eval.selectors.mapped_cache import ATTENTION_QUERIES, CachePrompt, prefill_with_attention
from rf_eval.selectors.registry import cache_selector
from rf_eval.testing import random_model, tiny_config


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_received_attention_is_the_stock_models_attention_weights_summed(family):
    """Summed over heads, the last 32 queries and the last quarter of the layers (appendix C, figure 13),
    read from `transformers`' own eager attention probabilities."""
    model = random_model(tiny_config(family, 259, attn_implementation="eager"), seed=3).eval()
    ids = torch.randint(0, 259, (1, 45), generator=torch.Generator().manual_seed(0))
    cache, received = prefill_with_attention(model, family_for(model.config), ids)
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    layers = len(out.attentions)
    first = layers - max(1, layers // 4)
    want = sum(a[0, :, -ATTENTION_QUERIES:].float().sum((0, 1)) for a in out.attentions[first:])
    torch.testing.assert_close(received, want, rtol=1e-4, atol=1e-5)
    assert len(cache.layers) == layers and cache.layers[0].keys.shape[2] == 45


def _prompt(**given):
    fields = dict(ids=torch.arange(12)[None], free=11, pick=3, mapped=None, seed=0, source_received=None,
                  target_prefill=None, target_attention=None)
    return CachePrompt(**{**fields, **given})


def test_each_selector_picks_its_scores_top_candidates():
    score = torch.tensor([0.0, 5, 1, 7, 2, 9, 3, 4, 6, 8, 0, 100.0])  # the last row is no candidate
    mapped = SimpleNamespace(score=score)
    assert cache_selector("rank").choose(_prompt(mapped=mapped)).tolist() == [3, 5, 9]
    assert cache_selector("source-attention").choose(_prompt(source_received=score)).tolist() == [3, 5, 9]
    oracle = _prompt(target_attention=lambda: (None, score))
    assert cache_selector("oracle-attention").choose(oracle).tolist() == [3, 5, 9]
    rows = cache_selector("random-positions").choose(_prompt(seed=4))
    assert rows.tolist() == sorted(set(rows.tolist())) and len(rows) == 3 and int(rows.max()) < 11
    assert torch.equal(rows, cache_selector("random-positions").choose(_prompt(seed=4)))
    flags = {name: (s.oracle, s.whole_layers, s.scores_mapping, s.source_attention)
             for name in ("rank", "source-attention", "oracle-l2", "layer-prefix")
             for s in [cache_selector(name)]}
    assert flags == {"rank": (False, False, True, False), "source-attention": (False, False, False, True),
                     "oracle-l2": (True, False, False, False), "layer-prefix": (False, True, False, False)}
