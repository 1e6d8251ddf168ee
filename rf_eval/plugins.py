"""One plug-in pattern for every kind of part rf-eval finds by name: fills, families, selectors, corrections.

A kind is a base class, a package and a `Registry` (a read-only mapping, name -> class) that finds, with
no list to edit: (1) the package's modules (not `skip`, not `_*`; none where `own_modules` is off: a kind
whose built-in plug-ins are entry points, as methods are), each defining subclasses of the base that set
`marker` (exactly one where `one_per_module`); (2) the modules of the folders in the path variable `env`
(separated as in PATH, read when the package is first imported; they import as `<package>.<module>`, so a
plug-in is one file outside the installed package); (3) the classes the entry-point group `group` names,
each under its entry point's name; (4) classes given to `register` at run time. A plug-in is named by its
class's `name`, or (`by_module`: families) by its module; a module or an entry point is imported only when
its plug-in is looked up. A name defined twice is refused,
naming both definitions; a module that does not import, or a class that breaks the kind's contract
(`check`), is one `PluginError` line (a `UserError`: no traceback) when the registry is first read.

A plug-in's parameters are its constructor's (`parameters`), and an instance's values are read back from
the attributes of the same names (`param_values`): nothing restates them.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any, TypeVar

from rf_eval.errors import UserError

P = TypeVar("P")
REQUIRED = inspect.Parameter.empty  #: the default of a parameter that has none


class PluginError(UserError, TypeError):
    """A plug-in that does not import, breaks its kind's contract or takes a taken name: one line naming it."""


@dataclass(frozen=True)
class Discovery:
    """Where a kind's plug-ins are found and how a module names them (see the module docstring): the path
    variable `env`, the entry-point `group`, the package's modules to `skip` (none read where `own_modules` is
    off), one class per module or several, the class attribute that names one (`marker`), or the module
    itself (`by_module`)."""

    env: str | None = None
    group: str | None = None
    skip: Iterable[str] = ("base",)
    one_per_module: bool = True
    marker: str = "name"
    by_module: bool = False
    own_modules: bool = True


class Registry(Mapping[str, type[P]]):
    """The plug-ins of one kind, name -> class, in the order found (see the module docstring)."""

    def __init__(self, kind: str, base: type[P], package: str, discovery: Discovery = Discovery(), *,
                 check: Callable[[type[P], str], None] | None = None, error: type[PluginError] = PluginError):
        self.kind, self.base, self.package, self.check, self.error = kind, base, package, check, error
        d = discovery
        self.env, self.group, self.skip, self.one_per_module = d.env, d.group, frozenset(d.skip), d.one_per_module
        self.marker, self.by_module, self.own_modules = d.marker, d.by_module, d.own_modules
        env = d.env
        #: the folders the path variable adds to the package's own
        self.extra = tuple(p for p in os.environ.get(env, "").split(os.pathsep) if p) if env else ()
        module = sys.modules[package]
        module.__path__ = [*module.__path__, *(p for p in self.extra if p not in module.__path__)]
        self._added: dict[str, type[P]] = {}
        self._generation = 0
        self._entries: dict[str, Any] | None = None
        self._merged: tuple[Any, dict[str, Any]] = ((), {})

    def __getitem__(self, name: str) -> type[P]:
        found = self._all()
        item = found[name]
        if not isinstance(item, type):  # a module (its folder) or an entry point, loaded when first looked up
            found[name] = self._classes(name, item)[0] if isinstance(item, str) else self._load(item, name)
        return found[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def version(self) -> tuple[tuple[str, ...], int]:
        """Changes whenever what the registry holds may have (the package's folders, registrations)."""
        return tuple(sys.modules[self.package].__path__), self._generation

    def register(self, cls: type[P], name: str | None = None) -> type[P]:
        """Add `cls` (under `name`, which a kind named by module needs); returns `cls`."""
        where = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"
        self._checked(cls, where)
        if name is None and self.by_module:
            raise TypeError(f"a {self.kind} registered at run time needs a name")
        name = cls.name if name is None else name
        have = self._all()
        if name in have and have[name] is not cls:
            raise self.error(f"{self.kind} {name!r} is already registered ({self._where(have[name])}); "
                             f"{where} defines it again")
        self._added[name] = cls
        self._generation += 1
        return cls

    def unregister(self, name: str) -> None:
        """Remove a class `register` added."""
        if self._added.pop(name, None) is not None:
            self._generation += 1

    def refresh(self) -> None:
        """Read the folders and entry points again (after installing a package; tests)."""
        self._entries = None
        self._generation += 1

    def _all(self) -> dict[str, Any]:
        """name -> class, or (not imported yet) its module's folder or its entry point."""
        version = self.version()
        if self._merged[0] == version:
            return self._merged[1]
        found = dict(self._scan(version[0]))
        for source in (self._entry_points(), self._added):
            for name, item in source.items():
                if name in found and found[name] is not item:
                    raise self.error(f"{self.kind} {name!r} is defined twice: in {self._where(found[name])} "
                                     f"and in {self._where(item)}")
                found[name] = item
        self._merged = (version, found)
        return found

    def _scan(self, folders: tuple[str, ...]) -> dict[str, Any]:
        modules: dict[str, str] = {}
        for folder in folders if self.own_modules else self.extra:
            for info in pkgutil.iter_modules([folder]):
                if info.name.startswith("_") or info.name in self.skip:
                    continue
                if info.name in modules:
                    what = f"{self.kind}{'' if self.by_module else ' module'} {info.name!r}"
                    raise self.error(f"{what} is defined twice: in {modules[info.name]} and in {folder}")
                modules[info.name] = folder
        if self.by_module:
            return dict(modules)
        found: dict[str, Any] = {}
        for module, folder in modules.items():
            for cls in self._classes(module, folder):
                if cls.name in found:
                    raise self.error(f"{self.kind} {cls.name!r} is defined twice: in "
                                     f"{found[cls.name].__module__} and in {cls.__module__}")
                found[cls.name] = cls
        return found

    def _classes(self, name: str, folder: str) -> list[type[P]]:
        """The plug-in classes that module `name` of `folder` defines, checked."""
        try:
            module = importlib.import_module(f"{self.package}.{name}")
        except Exception as err:
            on = f" (on {self.env})" if folder in self.extra else ""
            raise self.error(f"{self.kind} module {os.path.join(folder, name)}.py{on} does not import "
                             f"({type(err).__name__}: {err}); fix it"
                             + (f", or take its folder off {self.env}" if on else "")) from err
        classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, self.base)
                   and v.__module__ == module.__name__ and getattr(v, self.marker, None)]
        if len(classes) != 1 if self.one_per_module else not classes:
            raise self.error(f"{self.kind} module {module.__name__} ({folder}) must define "
                             f"{'exactly' if self.one_per_module else 'at least'} one {self.base.__name__} "
                             f"subclass that sets {self.marker}; it defines {[c.__name__ for c in classes]}")
        return [self._checked(cls, module.__name__) for cls in classes]

    def _load(self, entry: Any, name: str) -> type[P]:
        where = f"{self.kind} entry point {entry.name} ({entry.value})"
        try:
            cls = entry.load()
        except Exception as err:
            raise self.error(f"{where} does not import ({type(err).__name__}: {err})") from err
        cls = self._checked(cls, where)
        if not self.by_module and cls.name != name:
            raise self.error(f"{where} names a {self.kind} called {cls.name!r}; name the entry point {cls.name}")
        return cls

    def _entry_points(self) -> dict[str, Any]:
        """The group's entry points by name, each imported when its plug-in is first looked up."""
        if self._entries is None:
            self._entries = {entry.name: entry for entry in (entry_points(group=self.group) if self.group else ())}
        return self._entries

    def _checked(self, cls: Any, where: str) -> type[P]:
        if not (isinstance(cls, type) and issubclass(cls, self.base)) or not getattr(cls, self.marker, None):
            raise self.error(f"{where} must define a {self.base.__name__} subclass that sets {self.marker}")
        if self.check is not None:
            self.check(cls, where)
        return cls

    @staticmethod
    def _where(item: Any) -> str:
        if isinstance(item, type):
            return item.__module__
        return item if isinstance(item, str) else f"entry point {item.name} ({item.value})"


def mentions(annotation: Any, cls: type) -> bool:
    """Whether an annotation names `cls` or a subclass (`Selector | None`, `list[Selector]`)."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return issubclass(annotation, cls)
    return any(mentions(arg, cls) for arg in typing.get_args(annotation))


@cache
def parameters(cls: type) -> tuple[inspect.Parameter, ...]:
    """The named parameters of `cls`'s constructor (not `self`, `*args`, `**kwargs`), in order: each one's
    name, default (`REQUIRED` if none) and annotation (a type where the module's names resolve it)."""
    init = cls.__init__
    if init is object.__init__:
        return ()
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # a name only a type checker sees: keep the annotations' text
        hints = {}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.replace(annotation=hints.get(p.name, p.annotation))
                 for p in list(inspect.signature(init).parameters.values())[1:] if p.kind in named)


def param_values(obj: Any) -> dict[str, Any]:
    """What `obj` was built with: each constructor parameter's attribute of the same name (`name_` where
    a method has the name), in the constructor's order."""
    own, out = vars(obj), {}
    for param in parameters(type(obj)):
        attr = next((a for a in (param.name, param.name + "_") if a in own), None)
        if attr is None:
            raise TypeError(f"{type(obj).__name__} keeps no attribute for its parameter {param.name!r}: store "
                            f"it as self.{param.name} (self.{param.name}_ where a method has the name)")
        out[param.name] = own[attr]
    return out
