"""Which tensors a model's checkpoint lacked when `transformers` loaded it.

`from_pretrained` initialises a parameter the checkpoint does not hold at random and only logs it (its
"LOAD REPORT ... MISSING"); `hf` then runs on it. rf-eval refuses an arm that would read such a tensor
(`check_loaded`). While `recording_missing_keys()` is active, every model
`transformers` loads carries the keys its checkpoint lacked (`missing_keys(model)`), taken from the
loading information `from_pretrained(..., output_loading_info=True)` returns, without changing what
`from_pretrained` returns (lm-eval's `HFLM` calls it). On a `transformers` without that loading step the
recorder records nothing, and `missing_keys` is None: unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rf_eval.fields import ArmError
from rf_eval.fills import FILL_OFF, fill_named, registered_fills

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


def check_loaded(model: Any, fill: str, role: str = "the model") -> None:
    """Refuse (`ArmError`) a model whose checkpoint lacked a tensor that fill `fill` reads (`FILL_OFF`: the
    model's own forward), which `transformers` initialised at random (`rf_eval.fills.loading_report`); the tensors
    beyond the base model's that a method alone reads (`Fill.extra_tensors`) matter to that method only.
    `role` names the model in the message (a speculator, a RaReCache source)."""
    from rf_eval.fills.loading_report import missing_keys

    missing = missing_keys(model)
    if not missing:
        return
    extras = {m.extra_tensors for m in map(fill_named, registered_fills()) if m.extra_tensors}
    mine = "" if fill == FILL_OFF else fill_named(fill).extra_tensors
    read = sorted(k for k in missing if not any(mark in k for mark in extras) or (mine and mine in k))
    if read:
        shown = ", ".join(read[:4]) + (f" and {len(read) - 4} more" if len(read) > 4 else "")
        reader = "its forward" if fill == FILL_OFF else f"fill={fill}"
        raise ArmError(f"{role}'s checkpoint lacks {len(read)} tensor(s) that {reader} reads ({shown}); "
                       "transformers initialised them at random. Use a checkpoint that holds them")
