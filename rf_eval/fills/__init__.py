"""Fills, found by themselves and chosen by an arm's `fill=` (see `rf_eval.fills.base`).

Every module of this package except `base` (and names starting with `_`)
defines one `Fill` subclass, whose `name` is the `fill=` value. Nothing
lists them: `registered_fills()` reads the package's folders, the folders in
the environment variable `RF_EVAL_FILL_PATH` (separated like PATH, read when
this package is first imported: their modules import as
`rf_eval.fills.<module>`), and the `rf_eval.fills` entry-point group of
installed packages (each entry point names a `Fill` subclass), plus
any class given to `register_fill` at run time (the one plug-in pattern,
`rf_eval.plugins`). So a new fill is one file.

`exact` is not a fill: it is the fill switched off (every prompt runs
the plain model), valid wherever a fill name is (`FILL_OFF`).
"""

from __future__ import annotations

from rf_eval.engine.plan import FILL_OFF  # the arm with the fill off: every prompt runs the plain model
from rf_eval.fills.base import STRATEGIES, Fill
from rf_eval.plugins import Discovery, PluginError, Registry

__all__ = ["FILL_OFF", "ENTRY_POINTS", "FILLS", "FILL_PATH_ENV", "Fill", "absent_fills", "arm_fills",
           "fill_named", "predicting_fills", "register_fill", "registered_fills", "unregister_fill"]

FILL_PATH_ENV = "RF_EVAL_FILL_PATH"
ENTRY_POINTS = "rf_eval.fills"


class FillPluginError(PluginError):
    """A fill (a plugin on RF_EVAL_FILL_PATH, an entry point, a registered class) that cannot run:
    refused, in one line naming it, when the registry is first read, not at the first request."""


def _check(cls: type[Fill], where: str) -> None:
    """A fill's contract beyond its name: a known strategy, and the function or strategy it needs."""
    if cls.strategy not in STRATEGIES:
        raise FillPluginError(f"{where}: strategy {cls.strategy!r} is not one of {', '.join(STRATEGIES)}")
    if cls.name == FILL_OFF:
        raise FillPluginError(f"{where}: {FILL_OFF!r} is the fill switched off, not a fill's name")
    if cls.strategy == "inputs" and cls.fill_fn is Fill.fill_fn and cls.bind is Fill.bind:
        raise FillPluginError(f"{where}: fill {cls.name!r} (strategy 'inputs') must define fill_fn (or bind): "
                              "the function that predicts a late layer's input from the split states")
    if cls.strategy == "kv" and cls.row_fill is Fill.row_fill:
        raise FillPluginError(f"{where}: fill {cls.name!r} (strategy 'kv') must define row_fill")


#: every fill by name (`rf_eval.plugins.Registry`)
FILLS: Registry[Fill] = Registry("fill", Fill, __name__,
                                       Discovery(env=FILL_PATH_ENV, group=ENTRY_POINTS,
                                                 skip=("base", "loading_report")),
                                       check=_check, error=FillPluginError)


def register_fill(cls: type[Fill]) -> type[Fill]:
    """Add a fill at run time (a test's throwaway fill; a notebook's own). Returns `cls`."""
    return FILLS.register(cls)


def unregister_fill(name: str) -> None:
    """Remove a fill `register_fill` added."""
    FILLS.unregister(name)


def registered_fills() -> tuple[str, ...]:
    """The name of every fill, sorted."""
    return tuple(sorted(FILLS))


def arm_fills() -> tuple[str, ...]:
    """Every valid `fill=` value of a RidgeFill arm: the fill switched off, then the methods."""
    return (FILL_OFF, *registered_fills())


def fill_named(name: str) -> Fill:
    """The method named `name` (an instance); ValueError naming the valid fills for any other name."""
    if name not in FILLS:
        raise ValueError(f"unknown fill {name!r}; valid fills: {', '.join(arm_fills())}")
    return FILLS[name]()


def predicting_fills() -> list[str]:
    """The fills from predicted inputs (corrections, splices and the probe apply to them)."""
    return [n for n in registered_fills() if fill_named(n).supports_corrections]


def absent_fills() -> list[str]:
    """The fills whose filled rows are absent from late layers (cost_match controls)."""
    return [n for n in registered_fills() if fill_named(n).absent]
