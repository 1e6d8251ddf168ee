"""Every name `rf_eval.stats` documents is its defining object, whatever was imported first.

Importing a submodule sets the package attribute of the submodule's name, so a
function named like its own module (as `noninferiority` was) turned into the
module after `from rf_eval.stats import binomial_floor`. Each import order runs
in a fresh interpreter: the collision depends on what the process imported
before.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import rf_eval.stats as stats

SUBMODULES = sorted(m.name for m in pkgutil.iter_modules(stats.__path__))

# What each fresh interpreter runs first, before checking every exported name.
ORDERS = {
    "nothing": "",
    "binomial_floor_first": "from rf_eval.stats import binomial_floor",
    "every_submodule": "\n".join(f"import rf_eval.stats.{m}" for m in SUBMODULES),
    "every_submodule_reversed": "\n".join(f"import rf_eval.stats.{m}" for m in reversed(SUBMODULES)),
    "star_then_submodules": "from rf_eval.stats import *\n"
    + "\n".join(f"from rf_eval.stats.{m} import *" for m in SUBMODULES),
    "names_reversed": "\n".join(f"from rf_eval.stats import {n}" for n in reversed(stats.__all__)),
}

CHECK = """
import importlib
import rf_eval.stats
from rf_eval.stats import _EXPORTS
for name, module in _EXPORTS.items():
    defining = getattr(importlib.import_module(f"rf_eval.stats.{module}"), name)
    assert getattr(rf_eval.stats, name) is defining, (name, getattr(rf_eval.stats, name))
    assert defining.__module__ == f"rf_eval.stats.{module}", (name, defining.__module__)
    namespace = {}
    exec(f"from rf_eval.stats import {name}", namespace)
    assert namespace[name] is defining, name
# the documented call of the issue
result = rf_eval.stats.noninferiority([100.0] * 216, [100.0] * 216, margin=2.0, n_resamples=200)
assert result.passed and result.binding == "floor" and result.n == 216, result
print("ok", len(_EXPORTS))
"""


def test_no_exported_name_is_a_submodule_name():
    assert SUBMODULES and not set(stats.__all__) & set(SUBMODULES)
    assert set(stats.__all__) == set(stats._EXPORTS)
    assert set(stats._EXPORTS.values()) <= set(SUBMODULES)


@pytest.mark.parametrize("order", list(ORDERS))
def test_exported_names_are_the_defining_objects_in_any_import_order(order):
    code = ORDERS[order] + "\n" + CHECK
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", str(len(stats._EXPORTS))]
