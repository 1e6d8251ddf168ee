"""Selectors by name: `make_selector(name, **params)` and one-line arm strings (`rf_eval.arm_string`).

    make_selector("attention", share=0.1, window=64)
    make_selector("random", of="attention(share=0.1)", seed=3)
    make_selector("probe+special")                  # a union; special tokens on top
    selector_from("random(seed=3;of=attention)")    # the same grammar in one string

No list names the selectors (the one plug-in pattern, `rf_eval.plugins`): every module of this package but
this one defines `Selector` subclasses that set `name`, and so do the modules of the folders in
`RF_EVAL_SELECTOR_PATH` (separated like PATH, read when the package is first imported; they import as
`rf_eval.selectors.<module>`), the classes of installed packages' `rf_eval.selectors` entry points, and the
classes given to `register_selector`. A selector's parameters in an arm string are its constructor's:
a parameter annotated with `Selector` (`of=`, a union's `parts`) takes a nested selector string. So a new
selector is one file.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from rf_eval.arm_string import check_params, parse_parts
from rf_eval.plugins import Discovery, PluginError, Registry, mentions, parameters
from rf_eval.selectors.base import Selector, Union
from rf_eval.selectors.mapped_cache import CacheSelector

SELECTOR_PATH_ENV = "RF_EVAL_SELECTOR_PATH"
ENTRY_POINTS = "rf_eval.selectors"
# what a selector reads, by method: RidgeFill's the split layer's state, RaReCache's the mapped cache
READS = {"ridgefill": "split_state", "rarecache": "mapped_cache"}


def _check(cls: type[Selector], where: str) -> None:
    """A selector's contract beyond its name: it reads what one method gives, and chooses rows from it."""
    if cls.reads not in READS.values():
        raise PluginError(f"{where}: selector {cls.name!r} reads {cls.reads!r}, not one of "
                          f"{', '.join(READS.values())}")
    if cls.reads == "split_state" and cls.select is Selector.select:
        raise PluginError(f"{where}: selector {cls.name!r} must define select(req)")
    if cls.reads == "mapped_cache" and not (issubclass(cls, CacheSelector) and cls.choose is not CacheSelector.choose):
        raise PluginError(f"{where}: selector {cls.name!r} reads the mapped cache: it must subclass CacheSelector "
                          "and define choose(prompt)")


#: every selector by name, RidgeFill's and RaReCache's (`rf_eval.plugins.Registry`)
SELECTORS: Registry[Selector] = Registry("selector", Selector, "rf_eval.selectors",
                                         Discovery(env=SELECTOR_PATH_ENV, group=ENTRY_POINTS, skip=("registry",),
                                                   one_per_module=False), check=_check)


def register_selector(cls: type[Selector]) -> type[Selector]:
    """Add a selector class at run time (a test's throwaway; a notebook's own). Returns `cls`."""
    return SELECTORS.register(cls)


def unregister_selector(name: str) -> None:
    """Remove a selector `register_selector` added."""
    SELECTORS.unregister(name)


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
            raise ValueError(f"parameters for the selector string {name!r} go inside it, e.g. "
                             "'attention(share=0.1)+special'")
        return selector_from(name)
    cls = _check_reads(name, "ridgefill")
    accepted = {p.name: p for p in parameters(cls)}
    check_params("selector", name, params, tuple(accepted))
    for key, value in params.items():
        if value is not None and mentions(accepted[key].annotation, Selector):  # a nested selector string, dict, object
            many = typing.get_origin(accepted[key].annotation) in (list, tuple, Sequence)
            params[key] = [as_selector(v) for v in value] if many else as_selector(value)
    try:
        return cls(**params)
    except TypeError as err:  # a bad value type for a known parameter
        raise ValueError(f"selector {name!r}: {err}") from err


def selector_from(given: str | dict | Selector) -> Selector:
    """A selector from an arm string (`attention(share=0.1)+special`), a dict {"name": ..., **params}, or a
    selector."""
    if isinstance(given, Selector):
        return given
    if isinstance(given, dict):
        params = dict(given)
        if "name" not in params:
            raise ValueError(f"a selector dict needs a 'name'; got {given}")
        return make_selector(params.pop("name"), **params)
    parts = [make_selector(name, **params) for name, params in parse_parts(given)]
    return parts[0] if len(parts) == 1 else Union(parts)


def as_selector(value: Any) -> Selector:
    if isinstance(value, (Selector, dict, str)):
        return selector_from(value)
    raise ValueError(f"expected a selector (name, arm string or object), got {value!r}")
