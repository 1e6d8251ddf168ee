"""Fixtures of the sparse-attention tests: tiny models by family (each built once), fp32, SDPA."""

from __future__ import annotations

import pytest


class TinyModels(dict):
    """family -> (model, folder), built on first use."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, family):
        from transformers import AutoModelForCausalLM

        from rf_eval.testing import make_tiny_model

        folder = make_tiny_model(family, self.root / family, seed=0)
        self[family] = (AutoModelForCausalLM.from_pretrained(folder).eval(), str(folder))
        return self[family]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return TinyModels(tmp_path_factory.mktemp("sparse_models"))
