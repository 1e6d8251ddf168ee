"""Fixtures of the task tests: project-written data, the tiny model, helpers (`th`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"rf_eval_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fixtures = _load("task_fixtures")
helpers = _load("task_helpers")


@pytest.fixture(scope="session")
def th():
    """The helper module (task loading, the lm_eval command line)."""
    return helpers


@pytest.fixture(scope="session")
def fx():
    """The fixture-data writers (task_fixtures.py)."""
    return fixtures


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, Path]:
    """Essay haystack, nltk punkt params (set on NLTK_DATA), long documents, LongBench v2 items."""
    root = tmp_path_factory.mktemp("task_data")
    nltk_root = fixtures.write_punkt(root / "nltk")
    os.environ["NLTK_DATA"] = str(nltk_root)
    import nltk

    if str(nltk_root) not in nltk.data.path:
        nltk.data.path.insert(0, str(nltk_root))
    return {
        "essays": fixtures.write_essays(root / "essays"),
        "nltk": nltk_root,
        "docs": fixtures.write_documents(root / "docs", [1500, 700, 1700]),
        "longbench": fixtures.write_longbench(root / "longbench.json", n=3),
    }


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dir) -> str:
    return tiny_model_dir("llama")
