"""Which tensors a model's checkpoint lacked when `transformers` loaded it.

`from_pretrained` initialises a parameter the checkpoint does not hold at random and only logs it (its
"LOAD REPORT ... MISSING"); `hf` then runs on it. rf-eval refuses an arm that would read such a tensor
(`rf_eval.fills.base.check_loaded`). While `recording_missing_keys()` is active, every model
`transformers` loads carries the keys its checkpoint lacked (`missing_keys(model)`), taken from the
loading information `from_pretrained(..., output_loading_info=True)` returns, without changing what
`from_pretrained` returns (lm-eval's `HFLM` calls it). On a `transformers` without that loading step the
recorder records nothing, and `missing_keys` is None: unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the attribute a loaded model carries: the checkpoint keys transformers initialised at random
MISSING_ATTR = "rf_eval_missing_keys"


@contextmanager
def recording_missing_keys() -> Iterator[None]:
    """Record, on each model `transformers` loads meanwhile, the keys its checkpoint lacked."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__.get("_finalize_model_loading")  # the descriptor, restored after
    if original is None:  # another transformers: nothing to hook, nothing recorded
        yield
        return
    finalize = PreTrainedModel._finalize_model_loading  # callable as (model, load_config, loading_info)

    def recorded(model: Any, load_config: Any, loading_info: Any) -> Any:
        info = finalize(model, load_config, loading_info)
        setattr(model, MISSING_ATTR, frozenset(getattr(info, "missing_keys", None) or ()))
        return info

    PreTrainedModel._finalize_model_loading = staticmethod(recorded)
    try:
        yield
    finally:
        PreTrainedModel._finalize_model_loading = original


def missing_keys(model: Any) -> frozenset[str] | None:
    """The keys `model`'s checkpoint lacked (initialised at random), or None when its loading was not recorded."""
    return getattr(model, MISSING_ATTR, None)
