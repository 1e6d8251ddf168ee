"""The lm-eval adapter that runs a prefill method (what `rf-eval serve --model-args method=...` builds): the
method registry's shell (`rf_eval.methods`), so an adapter or a method is found, never listed, here."""

from __future__ import annotations

import importlib
from typing import Any

from rf_eval._startup import MODELS
from rf_eval.errors import UserError
from rf_eval.methods import adapter_name
from rf_eval.model_adapters.config import ModelArgsError
from rf_eval.model_adapters.prefill_lm import PrefillLM


def adapter_class(name: str) -> type[PrefillLM]:
    """The adapter of `name` (a method, or an adapter's lm-eval name), or a ModelArgsError naming the valid ones."""
    try:
        model = adapter_name(name)
    except UserError as err:
        raise ModelArgsError(f"{err}; or an lm-eval model of rf-eval: {', '.join(MODELS)}") from None
    module, _, cls = MODELS[model].partition(":")
    return getattr(importlib.import_module(module), cls)


def adapter_args(model_args: dict[str, Any], default: str = "ridgefill") -> tuple[type[PrefillLM], dict[str, Any]]:
    """(the adapter, its model_args) of a server's model_args, whose `method` (default `default`) names a method
    or an adapter: `method=` is kept where the adapter reads it (the method is not the adapter's namesake:
    `method=gemfilter` for `--model drop`, a plug-in's name for `--model prefill`)."""
    name = str(model_args.get("method") or default)
    cls = adapter_class(name)
    keep = name not in MODELS
    return cls, {k: v for k, v in model_args.items() if k != "method" or keep}
