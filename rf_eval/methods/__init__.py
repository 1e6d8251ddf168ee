"""Prefill methods, found by themselves and chosen by `method=` (see `rf_eval.methods.base.Method`).

Every module of this package except `base` (and names starting with `_`)
declares one `Method` subclass, whose `name` is its `method=` value: the
built-in ones (`ridgefill`, `rarecache`, `gemfilter`, `specprefill`) point at
their implementations. Nothing lists them: `METHODS` reads the package's
folders, the folders in the environment variable `RF_EVAL_METHOD_PATH`
(separated like PATH, read when this package is first imported: their modules
import as `rf_eval.methods.<module>`), the `rf_eval.methods` entry-point group
of installed packages, and classes given to `register_method` at run time (the
one plug-in pattern, `rf_eval.plugins`). So a new method is one file:

    lm_eval --model prefill --model_args pretrained=MODEL,method=NAME,<its arm's fields>

The lm-eval models (adapters) that run methods are `rf_eval._startup.MODELS`
(the same names as pyproject's `lm_eval.models` entry points); a method names
its own in `Method.model`. The adapters, `rf-eval serve` and the study runner
find a method, its arm and its adapter here (`method_class`, `adapter_name`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rf_eval._startup import MODELS
from rf_eval.methods.base import GENERIC_MODEL, Method, NoSettings
from rf_eval.plugins import PluginError, Registry

__all__ = ["ADAPTERS", "ENTRY_POINTS", "GENERIC_MODEL", "METHODS", "METHOD_PATH_ENV", "Method", "MethodPluginError",
           "NoSettings", "adapter_name", "method_class", "method_for_arm", "methods_of", "register_method", "unregister_method"]

METHOD_PATH_ENV = "RF_EVAL_METHOD_PATH"
ENTRY_POINTS = "rf_eval.methods"
#: the lm-eval models that run prefill methods (`rf_eval._startup.MODELS`, pyproject's entry points)
ADAPTERS: tuple[str, ...] = tuple(MODELS)


class MethodPluginError(PluginError):
    """A prefill method (a plug-in on RF_EVAL_METHOD_PATH, an entry point, a registered class) that cannot run."""


def _check(cls: type[Method], where: str) -> None:
    """A method's contract beyond its name: an arm dataclass, a known adapter, and a way to build it."""
    import dataclasses

    if not dataclasses.is_dataclass(cls.Arm):
        raise MethodPluginError(f"{where}: method {cls.name!r}: Arm must be a dataclass (its settings), "
                                f"got {cls.Arm!r}")
    if cls.model not in MODELS:
        raise MethodPluginError(f"{where}: method {cls.name!r}: model={cls.model!r} is not an rf-eval lm-eval "
                                f"model; valid: {', '.join(MODELS)}")
    if cls.name in MODELS and cls.model != cls.name:
        raise MethodPluginError(f"{where}: method {cls.name!r} takes the name of the lm-eval model --model {cls.name}")
    if cls.build.__func__ is Method.build.__func__:
        missing = [m for m in ("prefill", "is_plain", "prefill_cost") if getattr(cls, m) is getattr(Method, m)]
        if missing:
            raise MethodPluginError(f"{where}: method {cls.name!r} must define {', '.join(missing)} (or build)")


#: every prefill method by name (`rf_eval.plugins.Registry`)
METHODS: Registry[Method] = Registry("prefill method", Method, __name__, env=METHOD_PATH_ENV, group=ENTRY_POINTS,
                                     check=_check, error=MethodPluginError)


#: add a method at run time (a test's throwaway method; a notebook's own), and remove one so added
register_method, unregister_method = METHODS.register, METHODS.unregister


def method_class(name: str) -> type[Method]:
    """The method named `name`; a `MethodPluginError` (one line) naming the valid ones for any other name."""
    if name not in METHODS:
        raise MethodPluginError(f"method={name!r} is not a prefill method; valid: {', '.join(sorted(METHODS))} "
                                f"(a method of your own: one file in a folder on {METHOD_PATH_ENV})")
    return METHODS[name]


def methods_of(model: str) -> tuple[str, ...]:
    """The methods the lm-eval model `model` runs, sorted."""
    return tuple(sorted(name for name in METHODS if METHODS[name].model == model))


def method_for_arm(model: str, args: Mapping[str, Any]) -> type[Method] | None:
    """The method an arm of the lm-eval model `model` with model_args `args` runs (a study arm): the one its
    `method=` names, else the model's only method, else (the droppers) its methods' shared arm's default
    `method`; None for a model that is not rf-eval's."""
    if model not in MODELS:
        return None
    own = methods_of(model)
    name = args.get("method")
    if name is None and len(own) != 1:
        arms = {METHODS[m].Arm for m in own}
        default = getattr(next(iter(arms)), "method", None) if len(arms) == 1 else None
        name = default if default in own else None
    elif name is None:
        name = own[0]
    return METHODS[name] if name in own else None


def adapter_name(name: str) -> str:
    """The lm-eval model that runs `name`: a method's adapter, or `name` itself where it names an adapter."""
    return name if name in MODELS else method_class(name).model
