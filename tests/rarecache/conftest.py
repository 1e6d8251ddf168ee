"""Tiny source -> target pairs (one family, one tokenizer) and their fitted transfer maps, built once."""

from __future__ import annotations

import random

import pytest

WORDS = (
    "the a of to and in river stone lamp seven blue quiet market paper ladder window forty "
    "north clock garden signal copper ninety orange theory harbor"
).split()


def write_documents(folder, count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    paths = []
    for i in range(count):
        path = folder / f"doc{i}.txt"
        path.write_text(" ".join(rng.choice(WORDS) for _ in range(words)) + ".\n")
        paths.append(str(path))
    return paths


@pytest.fixture(scope="session")
def calibration(tmp_path_factory) -> list[str]:
    return write_documents(tmp_path_factory.mktemp("calibration"), count=4, words=40, seed=0)


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """`tiny_pair_dirs(family)` -> (source folder, target folder)."""
    from rf_eval.testing import make_tiny_pair

    built: dict = {}

    def get(family: str):
        if family not in built:
            built[family] = make_tiny_pair(family, tmp_path_factory.mktemp(f"pair_{family}"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def fitted(tiny_pair_dirs, calibration, tmp_path_factory):
    """`fitted(family)` -> dict(source, target, tokenizer, maps, maps_dir, source_dir, target_dir)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rf_eval.rarecache.fit import fit_transfer

    built: dict = {}

    def get(family: str):
        if family not in built:
            source_dir, target_dir = tiny_pair_dirs(family)
            source = AutoModelForCausalLM.from_pretrained(source_dir).eval()
            target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
            tok = AutoTokenizer.from_pretrained(target_dir)
            out = tmp_path_factory.mktemp(f"maps_{family}")
            maps, path = fit_transfer(source, target, tok, tok, calibration, k=2, rank=8, lam=0.01, out=out)
            built[family] = dict(source=source, target=target, tokenizer=tok, maps=maps, maps_dir=str(out),
                                 source_dir=str(source_dir), target_dir=str(target_dir))
        return built[family]

    return get


@pytest.fixture(scope="session")
def prompt(fitted):
    tok = fitted("llama")["tokenizer"]
    text = "garden signal 42: the copper clock by the north window reads seven. what does it read?"
    return tok(text, return_tensors="pt").input_ids
