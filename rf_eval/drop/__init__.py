"""Token-dropping prefill methods (RidgeFill paper Table 1, section 7: a skipped token leaves no cache entry).

Each method is one module here defining one `DropMethod` subclass whose
`name` is its `method=` value, found by `drop_class` (imported when first
asked for: `rf_eval.drop.result`, which the shells read, imports none of them).
An arm is a `DropArm` (`rf_eval.drop.arm_spec`) and the lm-eval model is
`--model drop` (`rf_eval.model_adapters.drop`). What the methods share is
`rf_eval.drop.base`; what their prefill leaves and how decoding reads it,
`rf_eval.drop.result`. FastKV's token-selective propagation keeps every row
below its layer and is an arm of RidgeFill's engine (`preset=fastkv`,
`rf_eval.selectors.tsp`).
"""

from __future__ import annotations

import importlib

#: method name -> its module under rf_eval.drop
DROP_METHODS = {"gemfilter": "gemfilter", "specprefill": "specprefill"}

__all__ = ["DROP_METHODS", "drop_class"]


def drop_class(name: str) -> type:
    """The `DropMethod` subclass named `name` (a ValueError naming the valid ones otherwise)."""
    if name not in DROP_METHODS:
        raise ValueError(f"method={name!r} is not a dropper; valid: {', '.join(DROP_METHODS)}")
    from rf_eval.drop.base import DropMethod

    module = importlib.import_module(f"{__name__}.{DROP_METHODS[name]}")
    (cls,) = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, DropMethod)
              and v.__module__ == module.__name__ and v.name == name]
    return cls
