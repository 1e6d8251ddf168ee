"""Fixtures of the sparse-attention tests: a tiny Llama and a tiny Qwen3 (built once), fp32, SDPA."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """family -> (model, folder)."""
    from transformers import AutoModelForCausalLM

    from rf_eval.testing import make_tiny_model

    out = {}
    for family in ("llama", "qwen3"):
        folder = make_tiny_model(family, tmp_path_factory.mktemp(f"sparse_{family}"), seed=0)
        out[family] = (AutoModelForCausalLM.from_pretrained(folder).eval(), str(folder))
    return out
