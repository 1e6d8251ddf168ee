"""Fixtures of the serving tests: a tiny model and `rf-eval serve` on loopback, always shut down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from serving_helpers import Served, child_env, start_server, write_punkt

# qwen3 with seed 1: its greedy answers to the tests' RULER prompts run the full 16 tokens, and the
# identity fill changes them (seed 0 answers "H" then EOS under every arm, which would test nothing).
FAMILY, SEED = "qwen3", 1


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory) -> str:
    from rf_eval.testing import make_tiny_model

    return str(make_tiny_model(FAMILY, tmp_path_factory.mktemp("serve_model"), seed=SEED))


@pytest.fixture(scope="session")
def nltk_data(tmp_path_factory) -> Path:
    root = write_punkt(tmp_path_factory.mktemp("nltk_data"))
    os.environ.setdefault("NLTK_DATA", str(root))  # for lm-eval's RULER import in this process
    return root


@pytest.fixture(scope="session")
def serve_env(nltk_data) -> dict[str, str]:
    return child_env(nltk_data)


@pytest.fixture(scope="session")
def exact_server(serve_model_dir, serve_env, tmp_path_factory) -> Served:
    """`rf-eval serve` with the fill off (the server's own arm: exact)."""
    # tail named: the server's arm is reported with it (the tests were written for a 1,024-row tail)
    served = start_server(serve_model_dir, tmp_path_factory.mktemp("exact_server"), serve_env, "--tail", "1024")
    yield served
    served.stop()
