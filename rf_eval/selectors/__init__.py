"""Exact-row selectors for RidgeFill (paper section 2.4): pluggable, named, composable.

See `registry.make_selector`; each selector's module documents its rule and
the decisions taken where the paper is silent. Every registered selector class
is also an attribute of this package by its class name
(`from rf_eval.selectors import Attention`), read from the registry: no list
names them.
"""

from __future__ import annotations

from typing import Any

from rf_eval.selectors.base import Request, Selector, Union
from rf_eval.selectors.registry import (
    SELECTORS,
    make_selector,
    register_selector,
    selector_from,
    unregister_selector,
)

__all__ = ["SELECTORS", "Request", "Selector", "Union", "make_selector", "register_selector", "selector_from",
           "unregister_selector"]


def __getattr__(name: str) -> Any:
    """A registered selector class by its class name (`rf_eval.selectors.Probe`); other names (submodules,
    dunders) are not looked up, so that importing a submodule never reads the registry."""
    if name[:1].isupper():
        for cls in SELECTORS.values():
            if cls.__name__ == name:
                return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
