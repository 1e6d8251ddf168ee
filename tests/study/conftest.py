"""Fixtures of the study tests: the adapter tests' local task (a JSONL, multiple choice and generation) and
long documents for keytoken_nll (the task tests' fixture writer)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "rf_eval_tests_adapter_helpers", Path(__file__).resolve().parent.parent / "model_adapters" / "adapter_helpers.py"
)
adapter_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(adapter_helpers)
_spec = importlib.util.spec_from_file_location(
    "rf_eval_tests_study_task_fixtures", Path(__file__).resolve().parent.parent / "tasks" / "task_fixtures.py"
)
task_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task_fixtures)


@pytest.fixture(scope="session")
def adapter_task(tmp_path_factory) -> Path:
    return adapter_helpers.write_task(tmp_path_factory.mktemp("study_task"))


@pytest.fixture(scope="session")
def keytoken_docs(tmp_path_factory) -> Path:
    return task_fixtures.write_documents(tmp_path_factory.mktemp("study_docs"), [700, 600])
