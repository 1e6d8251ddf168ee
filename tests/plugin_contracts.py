"""A kind's contract tests, called as functions in a fresh Python, for the tests that show that a plug-in on a
path variable is found and keeps its kind's contract with no other edit (tests/test_plugins.py,
tests/test_throwaway_plugins.py, tests/families/test_family_discovery.py).

A registry reads its path variable (RF_EVAL_SELECTOR_PATH, ...) when its package is first imported, so the
check runs in a process of its own: `run_contracts(script, env, folder)` saves `script` in `folder` and runs
it there (warm: tests/warm_start.py). The script reads the registries the contract tests are parametrized
over, calls the contract tests' functions for the plug-in's name (`contract_module` imports a test module as
pytest does; `tiny_model` stands in for tests/conftest.py's fixture of that name) and prints what it found
as one JSON line, which `run_contracts` returns. A contract check that fails raises there, and the script
exits non-zero with its traceback, which the assertion shows.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: what each script starts with: this folder on sys.path, for this module and the suite's shared helpers
PREAMBLE = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"


def contract_module(path: str):
    """The module tests/`path`, imported as pytest imports a test module (its folder first on sys.path, for
    the helper modules beside it)."""
    file = TESTS / path
    sys.path.insert(0, str(file.parent))
    return importlib.import_module(file.stem)


def tiny_model(folder: Path):
    """`tiny_model(family)` -> (model, tokenizer), as tests/conftest.py's fixture of that name gives them:
    built under `folder` and loaded once per family, fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.testing import make_tiny_model

    loaded: dict = {}

    def get(family: str):
        if family not in loaded:
            path = make_tiny_model(family, Path(folder) / f"tiny_{family}")
            loaded[family] = (AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path))
        return loaded[family]

    return get


def run_contracts(script: str, env: dict[str, str], folder: Path, *, args: Sequence[str] = (),
                  timeout: float = 600) -> dict:
    """Run `script` (after `PREAMBLE`; its arguments: `folder`, to write in, then `args`) in a fresh Python
    with `env`; the JSON object its last line of output holds. Asserts that it exits 0."""
    from warm_start import run_argv

    path = folder / "contracts.py"
    path.write_text(PREAMBLE + textwrap.dedent(script).lstrip())
    done = run_argv([sys.executable, str(path), str(folder), *args], cwd=folder, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
