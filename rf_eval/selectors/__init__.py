"""Exact-row selectors for RidgeFill (paper section 2.4): pluggable, named, composable.

See `registry.make_selector`; each selector's module documents its rule and
the decisions taken where the paper is silent.
"""

from rf_eval.selectors.attention import Attention, QuestionHidden
from rf_eval.selectors.base import Request, Selector, Union
from rf_eval.selectors.controls import LongerTail, RandomRows
from rf_eval.selectors.lexical import LexicalNet
from rf_eval.selectors.probe import Probe
from rf_eval.selectors.registry import SELECTORS, make_selector, selector_from
from rf_eval.selectors.tokens import ProtectedTokens, SpecialTokens
from rf_eval.selectors.tsp import TokenSelectivePropagation

__all__ = [
    "SELECTORS", "Attention", "LexicalNet", "LongerTail", "Probe", "ProtectedTokens", "QuestionHidden",
    "RandomRows", "Request", "Selector", "SpecialTokens", "TokenSelectivePropagation", "Union", "make_selector",
    "selector_from",
]
