"""The rf-eval lm-eval adapters by method name (what `rf-eval serve --model-args method=...` builds)."""

from __future__ import annotations

from rf_eval.model_adapters.config import ModelArgsError
from rf_eval.model_adapters.drop import DropLM
from rf_eval.model_adapters.prefill_lm import PrefillLM
from rf_eval.model_adapters.rarecache import RaReCacheLM
from rf_eval.model_adapters.ridgefill import RidgeFillLM

ADAPTERS: dict[str, type[PrefillLM]] = {cls.method_name: cls for cls in (RidgeFillLM, RaReCacheLM, DropLM)}


def adapter_class(name: str) -> type[PrefillLM]:
    """The adapter named `name`, or a ModelArgsError naming the valid ones."""
    if name not in ADAPTERS:
        raise ModelArgsError(f"method={name!r} is not an rf-eval method; valid methods: {', '.join(ADAPTERS)}")
    return ADAPTERS[name]
