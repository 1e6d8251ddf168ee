"""Fixtures of the dropper tests: a tiny target and its smaller speculator, one tokenizer (built once)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """(target, speculator, tokenizer, target folder, speculator folder): the tiny Llama pair of RaReCache's
    tests (`rf_eval.testing.make_tiny_pair`), fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.testing import make_tiny_pair

    source_dir, target_dir = make_tiny_pair("llama", tmp_path_factory.mktemp("drop_pair"))
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    speculator = AutoModelForCausalLM.from_pretrained(source_dir).eval()
    return target, speculator, AutoTokenizer.from_pretrained(target_dir), str(target_dir), str(source_dir)
