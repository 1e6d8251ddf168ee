"""Fixtures of the adapter tests (helpers live in adapter_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from adapter_helpers import write_task


@pytest.fixture(scope="session")
def adapter_task(tmp_path_factory) -> Path:
    return write_task(tmp_path_factory.mktemp("adapter_task"))

