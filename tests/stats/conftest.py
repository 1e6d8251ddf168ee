"""Fixtures for rf_eval.stats tests: synthetic lm-eval output folders."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def load_lmeval_format():
    """The synthetic lm-eval output writer (tests/stats/lmeval_format.py), loaded by path."""
    path = Path(__file__).resolve().parent / "lmeval_format.py"
    spec = importlib.util.spec_from_file_location("rf_eval_tests_lmeval_format", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def lmeval_format():
    return load_lmeval_format()
