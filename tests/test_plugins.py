"""The one plug-in pattern (`rf_eval.plugins`, issue #39 item 3): discovery in a package, a path variable,
entry points, run-time registration, names defined twice refused, one-line errors, parameters read from the
constructor; and a throwaway selector and correction, each one file outside the package, found through their
path variables and run by the kinds' contract tests (through the engine on a tiny model) with no other edit."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from plugin_contracts import run_contracts

from rf_eval import plugins
from rf_eval.plugins import REQUIRED, PluginError, Registry, mentions, param_values, parameters

TOY_INIT = '''
from rf_eval.plugins import Discovery, Registry


class Toy:
    name = ""


REGISTRY = Registry("toy", Toy, __name__, Discovery(env="RF_EVAL_TOY_PATH", group="toy.plugins", one_per_module={one}))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """`toy(one=True, **modules)`: a fresh package `toykind` whose modules are `modules` (name -> source)."""
    made = []

    def make(one: bool = True, **modules: str):
        package = tmp_path / f"toys{len(made)}" / "toykind"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(textwrap.dedent(TOY_INIT.format(one=one)))
        for name, source in modules.items():
            (package / f"{name}.py").write_text(textwrap.dedent(source))
        for name in [m for m in sys.modules if m == "toykind" or m.startswith("toykind.")]:
            del sys.modules[name]
        monkeypatch.syspath_prepend(str(package.parent))
        import toykind

        made.append(toykind)
        return toykind

    yield make
    for name in [m for m in sys.modules if m == "toykind" or m.startswith("toykind.")]:
        del sys.modules[name]


def plugin(cls: str, name: str, extra: str = "") -> str:
    return f"from toykind import Toy\n\n\nclass {cls}(Toy):\n    name = {name!r}\n{extra}"


def test_plugins_are_found_in_the_package_and_the_path_variable(toy, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c.py").write_text(plugin("C", "gamma"))
    monkeypatch.setenv("RF_EVAL_TOY_PATH", str(elsewhere))
    kind = toy(b=plugin("B", "beta"), a=plugin("A", "alpha"), _helper="X = 1\n", base="Y = 2\n")
    assert list(kind.REGISTRY) == ["alpha", "beta", "gamma"]  # module order; `_` modules and `base` skipped
    assert kind.REGISTRY["gamma"].__module__ == "toykind.c" and "delta" not in kind.REGISTRY
    assert str(elsewhere) in kind.__path__


def test_registration_entry_points_and_names_defined_twice(toy, monkeypatch):
    kind = toy(a=plugin("A", "alpha"))
    Toy = kind.Toy
    Extra = type("Extra", (Toy,), {"name": "extra"})
    assert kind.REGISTRY.register(Extra) is Extra and list(kind.REGISTRY) == ["alpha", "extra"]
    Twin = type("Twin", (Toy,), {"name": "alpha"})
    with pytest.raises(PluginError, match=r"toy 'alpha' is already registered \(toykind.a\); .*Twin defines it"):
        kind.REGISTRY.register(Twin)
    kind.REGISTRY.unregister("extra")
    assert list(kind.REGISTRY) == ["alpha"]

    class Entry:
        name, value = "packaged", "a_package:Packaged"

        def load(self):
            return type("Packaged", (Toy,), {"name": "packaged"})

    monkeypatch.setattr(plugins, "entry_points", lambda group: [Entry()] if group == "toy.plugins" else [])
    kind.REGISTRY.refresh()
    assert list(kind.REGISTRY) == ["alpha", "packaged"]
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    kind.REGISTRY.refresh()
    assert list(kind.REGISTRY) == ["alpha"]


@pytest.mark.parametrize("one, modules, says", [
    (True, {"a": plugin("A", "alpha"), "b": plugin("B", "alpha")},
     "toy 'alpha' is defined twice: in toykind.a and in toykind.b"),
    (True, {"a": plugin("A", "alpha") + plugin("A2", "alpha2").split("\n", 3)[3]},
     "toy module toykind.a ({folder}) must define exactly one Toy subclass that sets name; it defines ['A', 'A2']"),
    (False, {"a": "X = 1\n"}, "toy module toykind.a ({folder}) must define at least one Toy subclass that sets name"),
    (True, {"a": "import no_such_module_anywhere\n"},
     "toy module {folder}/a.py does not import (ModuleNotFoundError: No module named 'no_such_module_anywhere')"),
])  # fmt: skip
def test_a_broken_plugin_is_one_line_naming_it(toy, one, modules, says):
    kind = toy(one, **modules)
    with pytest.raises(PluginError) as err:
        list(kind.REGISTRY)
    assert says.format(folder=kind.__path__[0]) in str(err.value) and "\n" not in str(err.value)


def test_a_plugin_named_by_its_module_imports_only_when_looked_up(tmp_path, monkeypatch):
    package = tmp_path / "lazykind"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from rf_eval.plugins import Discovery, Registry\n\n\nclass Part:\n    kinds = ()\n\n\n"
        "REGISTRY = Registry('part', Part, __name__, Discovery(marker='kinds', by_module=True))\n")
    (package / "one.py").write_text("from lazykind import Part\n\n\nclass One(Part):\n    kinds = ('x',)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazykind

    try:
        assert list(lazykind.REGISTRY) == ["one"] and "lazykind.one" not in sys.modules
        assert lazykind.REGISTRY["one"].__name__ == "One" and "lazykind.one" in sys.modules
        one = lazykind.REGISTRY["one"]
        with pytest.raises(TypeError, match="needs a name"):
            lazykind.REGISTRY.register(one)
        lazykind.REGISTRY.register(one, "alias")
        assert list(lazykind.REGISTRY) == ["one", "alias"] and lazykind.REGISTRY["alias"] is one
    finally:
        for name in ("lazykind", "lazykind.one"):
            sys.modules.pop(name, None)


class Sample:
    def __init__(self, size: int, count: int | None = None, of: Registry | None = None, *args, **kwargs):
        self.size, self.count_ = size, count  # count_: `count` is the method
        self.of = of

    def count(self) -> int:
        return 0


def test_parameters_are_read_from_the_constructor():
    size, count, of = parameters(Sample)
    assert (size.name, size.default, size.annotation) == ("size", REQUIRED, int)
    assert (count.name, count.default, count.annotation) == ("count", None, int | None)
    assert mentions(of.annotation, Registry) and mentions(list[Registry], Registry)
    assert not mentions(count.annotation, Registry)
    assert param_values(Sample(3, count=2)) == {"size": 3, "count": 2, "of": None}
    assert parameters(type("Bare", (), {})) == ()
    forgetful = Sample(1)
    del forgetful.of
    with pytest.raises(TypeError, match="keeps no attribute for its parameter 'of'"):
        param_values(forgetful)


THROWAWAY_SELECTOR = '''
"""A throwaway selector (tests/test_plugins.py): every `step`-th candidate prefix row."""

from rf_eval.engine import Selection
from rf_eval.selectors.base import Selector


class EveryStep(Selector):
    name = "every_step"

    def __init__(self, step: int = 3):
        self.step = int(step)

    def select(self, req):
        return Selection(req.candidates()[:: self.step])
'''

THROWAWAY_CORRECTION = '''
"""A throwaway correction (tests/test_plugins.py): filled rows' values scaled by `factor`."""

from rf_eval.ridgefill.corrections.base import Correction


class ScaleValues(Correction):
    name = "scale_values"

    def __init__(self, factor: float = 0.5):
        self.factor = float(factor)

    def kv(self, view, k, v):
        v[:, :, view.filled] = v[:, :, view.filled] * self.factor
        return k, v
'''


#: the selector and correction contract tests (run through the engine on a tiny model), each called for every
#: throwaway its registry (the list the test is parametrized over) holds
CONTRACTS = """
import json, sys
from pathlib import Path

from plugin_contracts import contract_module, tiny_model

from rf_eval.ridgefill.corrections import CORRECTIONS
from rf_eval.selectors.registry import names_for

out = Path(sys.argv[1])
models = tiny_model(out / "models")
selectors = contract_module("selectors/test_selector_contract.py")
corrections = contract_module("ridgefill/test_correction_contract.py")
listed = {"ridgefill": names_for("ridgefill"), "rarecache": names_for("rarecache"), "correction": list(CORRECTIONS)}
contracts = [
    ("ridgefill", selectors.test_every_ridgefill_selector_keeps_the_contract, (models,)),
    ("rarecache", selectors.test_every_rarecache_selector_keeps_the_contract, ()),
    # state_table: read only for the corrections the contract's ARGS names (the terminal-state table)
    ("correction", corrections.test_every_correction_keeps_the_contract, (models, None)),
]
kept = []
for kind, contract, args in contracts:
    for name in ("every_step", "scale_values"):
        if name in listed[kind]:
            contract(*args, name)
            kept.append([contract.__name__, name])
print(json.dumps({"listed": listed, "kept": kept}))
"""


def test_a_throwaway_selector_and_correction_run_the_contract_tests_with_no_other_edit(tmp_path):
    """Each one file in a folder named by its path variable: the kinds' contract tests pick them up (they
    run each through the engine on a tiny model) and pass."""
    folders = {}
    for kind, source in (("selector", THROWAWAY_SELECTOR), ("correction", THROWAWAY_CORRECTION)):
        folders[kind] = tmp_path / kind
        folders[kind].mkdir()
        (folders[kind] / f"throwaway_{kind}.py").write_text(textwrap.dedent(source).lstrip())
    env = dict(os.environ, RF_EVAL_SELECTOR_PATH=str(folders["selector"]),
               RF_EVAL_CORRECTION_PATH=str(folders["correction"]), OMP_NUM_THREADS="1")
    (tmp_path / "contracts").mkdir()
    found = run_contracts(CONTRACTS, env, tmp_path / "contracts")
    assert "every_step" in found["listed"]["ridgefill"] and "scale_values" in found["listed"]["correction"]
    assert found["kept"] == [["test_every_ridgefill_selector_keeps_the_contract", "every_step"],
                             ["test_every_correction_keeps_the_contract", "scale_values"]]
