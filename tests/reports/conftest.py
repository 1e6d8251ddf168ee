"""Fixtures for rf_eval.reports tests: real lm-eval output folders, synthetic ones, browsers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def lmeval_format():
    """The synthetic lm-eval output writer of tests/stats, loaded by path."""
    spec = importlib.util.spec_from_file_location("rf_eval_tests_lmeval_format", HERE.parent / "stats" / "lmeval_format.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def lmeval_runs(tmp_path_factory):
    """Output folders of two arms written by lm-eval itself (see lmeval_runner.py): (exact, ridge)."""
    out = tmp_path_factory.mktemp("lmeval_runs")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["RF_EVAL_NO_LM_EVAL_HOOK"] = "1"  # lm-eval's own tasks only, plus the two the runner writes
    proc = subprocess.run(
        [sys.executable, str(HERE / "lmeval_runner.py"), str(out)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out / "exact", out / "ridge"
