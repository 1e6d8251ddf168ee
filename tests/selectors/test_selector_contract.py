"""Every registered selector keeps the selector contract (kvpress's `default_presses` idea, issue #39 item 3).

The list is the registry's (`rf_eval.selectors.registry.SELECTORS`), so a new selector, in the package or
in a folder on RF_EVAL_SELECTOR_PATH, is tested here the moment it is found (tests/test_plugins.py runs a
throwaway one). Each is built by name with its defaults (or the arguments in `ARGS`), rebuilt from what it
describes (its constructor's parameters: the run's provenance names a selector that can be made again),
and run: a RidgeFill selector inside the engine on a tiny model, where it returns sorted, unique prefix rows
and the arm's prefill keeps the exact tail; a RaReCache selector on a mapped cache, where it picks `pick`
sorted, unique positions among the candidates.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_selector_rows import TAIL, arm, ids_of, run_selector

from rf_eval.selectors import make_selector, selector_from
from rf_eval.selectors.mapped_cache import CachePrompt
from rf_eval.selectors.registry import cache_selector, names_for

#: arguments for the selectors whose defaults do not make one (they need one of several counts, or parts), and
#: FastKV's, whose default 2,048 rows would take every row of the test's prompt (a plain prefill, no selection)
ARGS = {"random": {"count": 4}, "longer_tail": {"count": 4}, "union": {"parts": ["special", "protected"]},
        "tsp": {"keep": 16}}


@pytest.mark.parametrize("name", names_for("ridgefill"))
def test_every_ridgefill_selector_keeps_the_contract(tiny_model, name):
    selector = make_selector(name, **ARGS.get(name, {}))
    described = selector.describe()
    assert selector.name == name and described["name"] == name
    assert type(selector)(**selector.params()).describe() == described
    assert selector_from(described).describe() == described  # provenance makes the same selector again

    model, tok = tiny_model("llama")
    ids = ids_of(tok)
    n = ids.shape[1]
    req, selection = run_selector(model, tok, selector, ids)
    rows = selection.rows
    assert rows.dtype == torch.long and torch.equal(rows, torch.unique(rows))  # sorted, no row twice
    assert rows.numel() == 0 or (int(rows.min()) >= 0 and int(rows.max()) < req.prefix_end)
    assert selection.tail is None or TAIL <= selection.tail <= n
    assert 0 <= selector.count(req) <= n

    result = arm(model, tok, selector).prefill(ids)
    exact = result.exact_rows
    assert torch.equal(exact, torch.unique(exact)) and torch.isfinite(result.logits).all()
    assert result.plan.tail >= TAIL and torch.equal(exact[-result.plan.tail:], torch.arange(n - result.plan.tail, n))


def _mapped_prompt() -> CachePrompt:
    """A mapped cache of 12 positions (11 candidates, 3 to pick) with every input a selector may read."""
    gen = torch.Generator().manual_seed(0)
    n, layers = 12, 2

    def kv():
        return [torch.randn(1, 2, n, 4, generator=gen) for _ in range(layers)]

    score = torch.rand(n, generator=gen)
    target = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in zip(kv(), kv())])
    mapped = SimpleNamespace(score=score, keys=kv(), values=kv())
    return CachePrompt(ids=torch.arange(n)[None], free=n - 1, pick=3, mapped=mapped, seed=0,
                       source_received=torch.rand(n, generator=gen), target_prefill=lambda: target,
                       target_attention=lambda: (target, torch.rand(n, generator=gen)))


@pytest.mark.parametrize("name", names_for("rarecache"))
def test_every_rarecache_selector_keeps_the_contract(name):
    selector = cache_selector(name)
    assert selector.name == name and type(selector)(**selector.params()).describe() == selector.describe()
    if selector.whole_layers:  # recomputes whole layers, not positions (tests/rarecache runs it)
        return
    prompt = _mapped_prompt()
    rows = selector.choose(prompt)
    assert rows.dtype == torch.long and torch.equal(rows, torch.unique(rows))
    assert rows.numel() == prompt.pick and int(rows.min()) >= 0 and int(rows.max()) < prompt.free
