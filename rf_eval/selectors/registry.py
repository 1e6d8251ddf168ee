"""Selectors by name: `make_selector(name, **params)` and one-line specs (`rf_eval.spec`).

    make_selector("attention", share=0.1, window=64)
    make_selector("random", of="attention(share=0.1)", seed=3)
    make_selector("probe+special")                  # a union; special tokens on top
    selector_from("random(seed=3;of=attention)")    # the same grammar in one string
"""

from __future__ import annotations

import inspect
from typing import Any

from rf_eval.selectors.attention import Attention, QuestionHidden
from rf_eval.selectors.base import Selector, Union
from rf_eval.selectors.controls import LongerTail, RandomRows
from rf_eval.selectors.lexical import LexicalNet
from rf_eval.selectors.mapped_cache import CACHE_SELECTORS, CacheSelector
from rf_eval.selectors.probe import Probe
from rf_eval.selectors.tokens import ProtectedTokens, SpecialTokens
from rf_eval.selectors.tsp import TokenSelectivePropagation
from rf_eval.spec import check_params, parse_spec

SELECTORS: dict[str, type[Selector]] = {
    cls.name: cls
    for cls in (Attention, QuestionHidden, RandomRows, LongerTail, Probe, ProtectedTokens, LexicalNet,
                SpecialTokens, TokenSelectivePropagation, Union, *CACHE_SELECTORS)
}
# what a selector reads, by method: RidgeFill's the split layer's state, RaReCache's the mapped cache
READS = {"ridgefill": "split_state", "rarecache": "mapped_cache"}
_SELECTOR_PARAMS = ("of",)  # parameters whose value is itself a selector


def parameters(cls: type[Selector]) -> tuple[str, ...]:
    sig = inspect.signature(cls.__init__)
    return tuple(p for p in sig.parameters if p != "self")


def names_for(method: str) -> tuple[str, ...]:
    """The registered selectors of `method` (ridgefill, rarecache), in registry order."""
    return tuple(name for name, cls in SELECTORS.items() if cls.reads == READS[method])


def _check_reads(name: str, method: str) -> type[Selector]:
    """The selector class `name`, ValueError naming the valid ones when unknown or another method's."""
    valid = ", ".join(sorted(names_for(method)))
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; valid {method} selectors: {valid}")
    cls = SELECTORS[name]
    if cls.reads != READS[method]:
        owner = next(m for m, reads in READS.items() if reads == cls.reads)
        raise ValueError(f"selector {name!r} is a {owner} selector (it reads the {cls.reads.replace('_', ' ')}); "
                         f"valid {method} selectors: {valid}")
    return cls


def cache_selector(name: str) -> CacheSelector:
    """RaReCache's selector `name` (no parameters: the budget and seed are the arm's)."""
    return _check_reads(name, "rarecache")()


def make_selector(name: str, **params: Any) -> Selector:
    """A RidgeFill selector by registry name with its parameters; `a+b` is the union of a and b."""
    if "+" in name or "(" in name:
        if params:
            raise ValueError(f"parameters for the spec {name!r} go inside it, e.g. 'attention(share=0.1)+special'")
        return selector_from(name)
    cls = _check_reads(name, "ridgefill")
    check_params("selector", name, params, parameters(cls))
    if name == "union":
        params["parts"] = [as_selector(p) for p in params.get("parts", [])]
    for key in _SELECTOR_PARAMS:
        if params.get(key) is not None:
            params[key] = as_selector(params[key])
    try:
        return cls(**params)
    except TypeError as err:  # a bad value type for a known parameter
        raise ValueError(f"selector {name!r}: {err}") from err


def selector_from(spec: str | dict | Selector) -> Selector:
    """A selector from a spec string, a dict {"name": ..., **params}, or a selector."""
    if isinstance(spec, Selector):
        return spec
    if isinstance(spec, dict):
        params = dict(spec)
        if "name" not in params:
            raise ValueError(f"a selector dict needs a 'name'; got {spec}")
        return make_selector(params.pop("name"), **params)
    parts = [make_selector(name, **params) for name, params in parse_spec(spec)]
    return parts[0] if len(parts) == 1 else Union(parts)


def as_selector(value: Any) -> Selector:
    if isinstance(value, (Selector, dict, str)):
        return selector_from(value)
    raise ValueError(f"expected a selector (name, spec or object), got {value!r}")
