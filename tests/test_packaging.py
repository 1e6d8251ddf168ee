"""What the package declares: lm-eval's entry points, the startup hook beside them, the floors' pins (issue #27)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rf_eval.model_adapters import startup as _startup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "RF_EVAL_NO_LM_EVAL_HOOK"}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=300)


def our_entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="lm_eval.models") if ep.dist.name == "rf-eval"}


def test_installed_metadata_lists_both_models_in_lm_evals_group():
    declared = PYPROJECT["project"]["entry-points"]["lm_eval.models"]
    assert declared == _startup.MODELS  # one list of models: the hook's and the entry points agree
    assert our_entry_points() == declared, "the installed metadata is stale: run `pip install -e .` again"


def test_each_entry_point_loads_a_name_of_the_one_adapter():
    from lm_eval.api.model import LM

    from rf_eval.model_adapters.prefill_lm import ModelName, PrefillLM

    assert issubclass(PrefillLM, LM)
    for ep in entry_points(group="lm_eval.models"):
        if ep.dist.name == "rf-eval":
            named = ep.load()  # what lm-eval builds a model from: `create_from_arg_string` of it
            assert isinstance(named, ModelName) and named.name == ep.name and named.lm_class is PrefillLM


def test_the_installed_lm_eval_resolves_both_names():
    code = (
        "from lm_eval.api import registry\nfrom rf_eval.model_adapters.startup import has_model_discovery\n"
        "print(registry.get_model('ridgefill').name, registry.get_model('rarecache').name,"
        " has_model_discovery(registry))\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    names = proc.stdout.split()
    assert names[:2] == ["ridgefill", "rarecache"], proc.stdout  # by the hook, or by lm-eval's discovery


FAKE_REGISTRY = """
class Registry:
    def __init__(self):
        self.objs = {}

    def __contains__(self, name):
        return name in self.objs

    def register(self, name, target=None):
        self.objs[name] = target


model_registry = Registry()
"""

DISCOVERY = """

def load_plugins(group, registry):  # lm-eval with EleutherAI/lm-evaluation-harness#4013 has this
    return []
"""


@pytest.mark.parametrize("discovery", [True, False], ids=["discovery", "no-discovery"])
def test_the_hook_stands_aside_where_lm_eval_discovers_plugins(tmp_path, discovery):
    """A stand-in lm-eval shadows the real one: with `load_plugins` in its registry (entry-point discovery) the
    startup hook registers nothing; without it, the hook registers both models as it does on lm-eval 0.4.13."""
    api = tmp_path / "lm_eval" / "api"
    api.mkdir(parents=True)
    (tmp_path / "lm_eval" / "__init__.py").write_text("")
    (api / "__init__.py").write_text("")
    (api / "registry.py").write_text(FAKE_REGISTRY + (DISCOVERY if discovery else ""))
    (tmp_path / "lm_eval" / "models").mkdir()
    (tmp_path / "lm_eval" / "models" / "__init__.py").write_text("from lm_eval.api import registry\n")
    code = (
        "import json, sys\nimport lm_eval.models\nfrom lm_eval.api.registry import model_registry\n"
        "assert 'rf_eval.model_adapters.startup' in sys.modules\nprint(json.dumps(model_registry.objs))\n"
    )
    proc = python(code, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout) == ({} if discovery else _startup.MODELS)


def _floors_module():
    spec = importlib.util.spec_from_file_location("rf_eval_ci_floors", ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_floors_pin_every_declared_dependency_at_its_lower_bound(capsys):
    floors = _floors_module()
    extras = sorted(PYPROJECT["project"]["optional-dependencies"])
    assert floors.main(["--extras", ",".join(extras), "--override", "torch==2.13.0", str(ROOT / "pyproject.toml")]) == 0
    pins = dict(line.split("==") for line in capsys.readouterr().out.split())
    assert pins["torch"] == "2.13.0" and pins["transformers"] == "5.24" and pins["lm-eval"] == "0.4.13"
    assert pins["pyyaml"] == "6" and "lm-eval[ruler]" not in pins  # names normalized, extras dropped
    declared = [*PYPROJECT["project"]["dependencies"],
                *(r for e in extras for r in PYPROJECT["project"]["optional-dependencies"][e])]
    assert set(pins) == {floors.normalize(floors._REQUIREMENT.match(r)[1]) for r in declared}


@pytest.mark.parametrize(
    "deps, message",
    [(['"foo<2"'], "exactly one lower bound"), (['"foo>=1"', '"Foo>=2"'], "two lower bounds")],
    ids=["no-floor", "two-floors"],
)
def test_floors_refuse_a_dependency_without_one_clear_floor(tmp_path, deps, message):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project]\nname = "x"\ndependencies = [{", ".join(deps)}]\n')
    with pytest.raises(SystemExit, match=message):
        _floors_module().main([str(pyproject)])
