"""Fixtures of the study tests: the adapter tests' local task (a JSONL, multiple choice and generation)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "rf_eval_tests_adapter_helpers", Path(__file__).resolve().parent.parent / "model_adapters" / "adapter_helpers.py"
)
adapter_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(adapter_helpers)


@pytest.fixture(scope="session")
def adapter_task(tmp_path_factory) -> Path:
    return adapter_helpers.write_task(tmp_path_factory.mktemp("study_task"))
