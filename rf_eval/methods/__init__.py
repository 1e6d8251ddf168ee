"""Prefill methods, found by name: `method=NAME` in model_args, a study arm or a served request.

A method is one `rf_eval.methods.base.Method` subclass in one file. Nothing
lists them: `METHODS` reads the `rf_eval.methods` entry-point group of
installed packages (where rf-eval's own methods are declared too, in its
pyproject.toml), the modules of the folders in the environment variable
`RF_EVAL_METHOD_PATH` (separated like PATH, read when this package is first
imported; they import as `rf_eval.methods.<module>`), and classes given to
`register_method` at run time (the one plug-in pattern, `rf_eval.plugins`).

One lm-eval model runs every method (`rf_eval.model_adapters.prefill_lm`);
its names (`MODELS`) differ only in the method they run when model_args name
none:

    lm_eval --model prefill --model_args pretrained=MODEL,method=NAME,<its arm's fields>
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from rf_eval.methods.base import Method, ModelSource, NoSettings, PromptPlan
from rf_eval.plugins import Discovery, PluginError, Registry

__all__ = ["ENTRY_POINTS", "METHODS", "METHOD_PATH_ENV", "MODELS", "Method", "MethodPluginError", "ModelSource",
           "NoSettings", "PromptPlan", "chosen_method", "method_class", "method_for_arm", "register_method",
           "unregister_method"]

METHOD_PATH_ENV = "RF_EVAL_METHOD_PATH"
#: lm-eval's names of the one adapter (`rf_eval.model_adapters.startup.MODELS`), each with the method it runs
#: when model_args name none (`prefill`: none, `method=` is required)
MODELS: dict[str, str | None] = {"ridgefill": "ridgefill", "rarecache": "rarecache", "drop": "gemfilter",
                                 "prefill": None}
ENTRY_POINTS = "rf_eval.methods"


class MethodPluginError(PluginError):
    """A prefill method (a plug-in on RF_EVAL_METHOD_PATH, an entry point, a registered class) that cannot run."""


#: the protocol's entry points a method implements, and the keyword each must take (the prompt's plan)
_TAKES_PLAN = ("prefill", "prefill_cost")


def _check(cls: type[Method], where: str) -> None:
    """A method's contract beyond its name: an arm dataclass, a name of its own, a way to prefill."""
    import dataclasses

    if not dataclasses.is_dataclass(cls.Arm):
        raise MethodPluginError(f"{where}: method {cls.name!r}: Arm must be a dataclass (its settings), "
                                f"got {cls.Arm!r}")
    if cls.name in MODELS and MODELS[cls.name] != cls.name:
        raise MethodPluginError(f"{where}: method {cls.name!r} takes the name of the lm-eval model --model "
                                f"{cls.name}")
    missing = [m for m in _TAKES_PLAN if getattr(cls, m) is getattr(Method, m)]
    if cls.plan is Method.plan and cls.is_plain is Method.is_plain:
        missing.append("is_plain (or plan)")
    if missing:
        raise MethodPluginError(f"{where}: method {cls.name!r} must define {', '.join(missing)}")
    old = [m for m in _TAKES_PLAN if "plan" not in inspect.signature(getattr(cls, m)).parameters]
    if old:
        raise MethodPluginError(f"{where}: method {cls.name!r}: {', '.join(old)} must take plan=None (the "
                                "prompt's `PromptPlan`, decided once by the caller)")


#: every prefill method by name (`rf_eval.plugins.Registry`)
METHODS: Registry[Method] = Registry("prefill method", Method, __name__,
                                     Discovery(env=METHOD_PATH_ENV, group=ENTRY_POINTS, own_modules=False),
                                     check=_check, error=MethodPluginError)

#: add a method at run time (a test's throwaway method; a notebook's own), and remove one so added
register_method, unregister_method = METHODS.register, METHODS.unregister


def method_class(name: str) -> type[Method]:
    """The method named `name`; a `MethodPluginError` (one line) naming the valid ones for any other name."""
    if name not in METHODS:
        adapter = f" (--model {name} is an lm-eval model name; its method is {MODELS[name]})" \
            if MODELS.get(name) else ""
        raise MethodPluginError(f"method={name!r} is not a prefill method{adapter}; valid: "
                                f"{', '.join(sorted(METHODS))} (a method of your own: one file in a folder on "
                                f"{METHOD_PATH_ENV})")
    return METHODS[name]


def chosen_method(args: Mapping[str, Any], model: str = "prefill") -> tuple[type[Method], dict[str, Any]]:
    """(the method a run of the lm-eval model `model` with model_args `args` runs, its model_args without the
    keys that chose it): `method=`, else the model's default method. A `preset=` that names a method
    (`preset=fastkv`, `preset=pop`: RidgeFill's published configurations, `Method.alias`) is that method."""
    args = dict(args)
    name = args.pop("method", None) or MODELS.get(model)
    if not name:
        raise MethodPluginError(f"--model {model} needs method=<a prefill method>; valid: "
                                f"{', '.join(sorted(METHODS))}")
    cls = method_class(str(name))
    alias = cls.alias(args)
    if alias is None:
        return cls, args
    return method_class(alias[0]), alias[1]


def method_for_arm(model: str, args: Mapping[str, Any]) -> tuple[type[Method], dict[str, Any]] | None:
    """`chosen_method` of a study arm (`model`, `args`), or None for a model that is not rf-eval's or args that
    name no method (the arm's preflight then says why, naming its line)."""
    if model not in MODELS:
        return None
    try:
        return chosen_method(args, model)
    except MethodPluginError:
        return None
