"""Fill methods, found by themselves and chosen by an arm's `fill=` (see `rf_eval.fills.base`).

Every module of this package except `base` (and names starting with `_`)
defines one `FillMethod` subclass, whose `name` is the `fill=` value. Nothing
lists them: `registered_fills()` reads the package's folders, the folders in
the environment variable `RF_EVAL_FILL_PATH` (separated like PATH, read when
this package is first imported: their modules import as
`rf_eval.fills.<module>`), and the `rf_eval.fills` entry-point group of
installed packages (each entry point names a `FillMethod` subclass), plus
any class given to `register_fill` at run time. So a new fill method is one
file.

`exact` is not a fill method: it is the fill switched off (every prompt runs
the plain model), valid wherever a fill name is (`FILL_OFF`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from functools import cache
from importlib.metadata import entry_points

from rf_eval.engine.plan import FILL_OFF  # the arm with the fill off: every prompt runs the plain model
from rf_eval.errors import UserError
from rf_eval.fills.base import STRATEGIES, FillMethod

__all__ = ["FILL_OFF", "ENTRY_POINTS", "FILL_PATH_ENV", "FillMethod", "absent_fills", "arm_fills", "fill_method",
           "predicting_fills", "register_fill", "registered_fills"]

FILL_PATH_ENV = "RF_EVAL_FILL_PATH"
ENTRY_POINTS = "rf_eval.fills"
_NOT_FILLS = frozenset({"base"})
_added: dict[str, type[FillMethod]] = {}

_plugin_folders = [p for p in os.environ.get(FILL_PATH_ENV, "").split(os.pathsep) if p]
__path__ = [*__path__, *_plugin_folders]


class FillPluginError(UserError, TypeError):
    """A fill method (a plugin on RF_EVAL_FILL_PATH, an entry point, a registered class) that cannot run:
    refused, in one line naming it, when the registry is first read, not at the first request."""


def _check(cls: object, where: str) -> type[FillMethod]:
    if not (isinstance(cls, type) and issubclass(cls, FillMethod)) or not cls.name:
        raise FillPluginError(f"{where} must define a FillMethod subclass that sets name")
    if cls.strategy not in STRATEGIES:
        raise FillPluginError(f"{where}: strategy {cls.strategy!r} is not one of {', '.join(STRATEGIES)}")
    if cls.name == FILL_OFF:
        raise FillPluginError(f"{where}: {FILL_OFF!r} is the fill switched off, not a fill method's name")
    if cls.strategy == "inputs" and cls.fill_fn is FillMethod.fill_fn and cls.bind is FillMethod.bind:
        raise FillPluginError(f"{where}: fill {cls.name!r} (strategy 'inputs') must define fill_fn (or bind): "
                              "the function that predicts a late layer's input from the split states")
    if cls.strategy == "kv" and cls.row_fill is FillMethod.row_fill:
        raise FillPluginError(f"{where}: fill {cls.name!r} (strategy 'kv') must define row_fill")
    return cls


def _import_fill_module(name: str, folder: str):
    """A fill module; a plugin that does not import (a syntax error, a missing import) is one line naming
    its file and the variable that put it there."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except Exception as err:
        where = f" (on {FILL_PATH_ENV})" if folder in _plugin_folders else ""
        detail = f"{type(err).__name__}: {err}"
        raise FillPluginError(f"fill module {os.path.join(folder, name)}.py{where} does not import ({detail}); "
                              f"fix it, or take its folder off {FILL_PATH_ENV}") from err


@cache
def _module_fills(path: tuple[str, ...]) -> dict[str, type[FillMethod]]:
    found: dict[str, type[FillMethod]] = {}
    for folder in path:
        for info in pkgutil.iter_modules([folder]):
            if info.name.startswith("_") or info.name in _NOT_FILLS:
                continue
            module = _import_fill_module(info.name, folder)
            classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, FillMethod)
                       and v.__module__ == module.__name__ and v.name]
            if len(classes) != 1:
                raise FillPluginError(f"fill module {module.__name__} ({folder}) must define exactly one FillMethod "
                                f"subclass that sets name; it defines {[c.__name__ for c in classes]}")
            cls = _check(classes[0], module.__name__)
            if cls.name in found:
                raise FillPluginError(f"fill {cls.name!r} is defined twice: in {found[cls.name].__module__} and "
                                      f"{module.__name__}")
            found[cls.name] = cls
    return found


@cache
def _entry_point_fills() -> dict[str, type[FillMethod]]:
    found = {}
    for ep in entry_points(group=ENTRY_POINTS):
        cls = _check(ep.load(), f"entry point {ep.name} ({ep.value})")
        found[cls.name] = cls
    return found


def _all() -> dict[str, type[FillMethod]]:
    fills = dict(_module_fills(tuple(__path__)))
    for source in (_entry_point_fills(), _added):
        for name, cls in source.items():
            if name in fills and fills[name] is not cls:
                raise ValueError(f"fill {name!r} is defined twice: in {fills[name].__module__} and {cls.__module__}")
            fills[name] = cls
    return fills


def register_fill(cls: type[FillMethod]) -> type[FillMethod]:
    """Add a fill method at run time (a test's throwaway fill; a notebook's own). Returns `cls`."""
    _check(cls, cls.__module__ + "." + cls.__qualname__)
    if cls.name in _all() and _all()[cls.name] is not cls:
        raise ValueError(f"fill {cls.name!r} is already registered ({_all()[cls.name].__module__})")
    _added[cls.name] = cls
    return cls


def unregister_fill(name: str) -> None:
    """Remove a fill `register_fill` added."""
    _added.pop(name, None)


def registered_fills() -> tuple[str, ...]:
    """The name of every fill method, sorted."""
    return tuple(sorted(_all()))


def arm_fills() -> tuple[str, ...]:
    """Every valid `fill=` value of a RidgeFill arm: the fill switched off, then the methods."""
    return (FILL_OFF, *registered_fills())


def fill_method(name: str) -> FillMethod:
    """The method named `name` (an instance); ValueError naming the valid fills for any other name."""
    fills = _all()
    if name not in fills:
        raise ValueError(f"unknown fill {name!r}; valid fills: {', '.join(arm_fills())}")
    return fills[name]()


def predicting_fills() -> list[str]:
    """The fills from predicted inputs (corrections, splices and the probe apply to them)."""
    return [n for n in registered_fills() if fill_method(n).supports_corrections]


def absent_fills() -> list[str]:
    """The fills whose filled rows are absent from late layers (cost_match controls)."""
    return [n for n in registered_fills() if fill_method(n).absent]
