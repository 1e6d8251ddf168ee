"""The startup hook that lets the plain `lm_eval` command find rf-eval (model_adapters/startup.py, setup.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from adapter_helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "lm_eval", "datasets", "numpy")


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**cli_env(), **env}, capture_output=True, text=True,
                          timeout=300)


def test_the_pth_file_is_installed():
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    assert any((Path(d) / "rf_eval_lm_eval.pth").is_file() for d in dirs), dirs


def test_startup_is_cheap_and_imports_nothing_heavy():
    proc = python("import sys, json; print(json.dumps(sorted(sys.modules)))")
    assert proc.returncode == 0 and proc.stderr == ""
    loaded = json.loads(proc.stdout)
    assert "rf_eval.model_adapters.startup" in loaded
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]


@pytest.mark.parametrize(
    "shadow",
    ["raise ModuleNotFoundError(\"No module named 'lm_eval'\")", "raise RuntimeError('broken lm-eval')"],
    ids=["absent", "broken"],
)
def test_an_absent_or_broken_lm_eval_never_breaks_python(tmp_path, shadow):
    package = tmp_path / "lm_eval"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text(shadow + "\n")
    (package / "tasks").mkdir()
    (package / "tasks" / "__init__.py").write_text(shadow + "\n")
    assert python("pass", PYTHONPATH=str(tmp_path)).returncode == 0
    proc = python("import lm_eval.models", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1 and shadow.split("(")[0].split()[-1] in proc.stderr  # lm-eval's own error, untouched
    (package / "__init__.py").write_text(shadow + "\n")
    proc = python("print('ok')", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout == "ok\n" and proc.stderr == ""


def test_lm_eval_finds_the_model_and_the_tasks_folder():
    code = (
        "from lm_eval.api.registry import get_model, model_registry\n"
        "from lm_eval.tasks import TaskManager\n"
        "print(get_model('ridgefill').name, 'hf' in model_registry)\n"
        "print(' '.join(TaskManager(include_defaults=False).all_tasks))\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    first, tasks = proc.stdout.splitlines()
    assert first == "ridgefill True"
    names = set()
    for yaml in (ROOT / "tasks").rglob("*.yaml"):
        names |= set(re.findall(r"^(?:task|group): *([\w-]+) *$", yaml.read_text(), re.M))
    assert names and names <= set(tasks.split())
    off = python("from lm_eval.api.registry import model_registry\nimport lm_eval.models\n"
                 "print('ridgefill' in model_registry)", RF_EVAL_NO_LM_EVAL_HOOK="1")
    assert off.stdout.strip() == "False"


def test_regular_and_editable_wheels_both_carry_the_pth(tmp_path):
    """Both wheels setuptools builds (pip install . / pip install -e .) put the .pth in site-packages."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("rf_eval", "model_adapters", "tasks", "stats", "reports"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheels"
    code = (
        "import sys; from setuptools import build_meta as b\n"
        f"b.build_wheel({str(out)!r}); b.build_editable({str(out)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 2
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            line = zf.read("rf_eval_lm_eval.pth").decode()
            assert line.startswith("import sys; exec(") and "import rf_eval.model_adapters.startup" in line and line.count("\n") == 1
            record = zf.read(next(n for n in zf.namelist() if n.endswith("RECORD"))).decode()
            assert "rf_eval_lm_eval.pth," in record
