"""Demo calibration/held-out text: standard-library docstrings, deterministic, disjoint, sized in tokens."""

from __future__ import annotations

import json

import pytest

from rf_eval.demo.corpus import write_demo_corpus


class WordTokenizer:
    """A stand-in tokenizer for the fast tests: one token per whitespace-separated word."""

    name_or_path = "words"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def _read(folder, name):
    return [json.loads(line)["text"] for line in (folder / f"{name}.jsonl").read_text().splitlines()]


def _check(a, b, manifest, n_cal, n_held, lo, hi):
    for name in ("calibration.jsonl", "heldout.jsonl", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    cal, held = _read(a, "calibration"), _read(a, "heldout")
    assert len(cal) == n_cal and len(held) == n_held
    assert len(set(cal) | set(held)) == n_cal + n_held
    cal_paras = {p for doc in cal for p in doc.split("\n\n")}
    held_paras = {p for doc in held for p in doc.split("\n\n")}
    assert not cal_paras & held_paras
    assert not set(manifest["modules"]["calibration"]) & set(manifest["modules"]["heldout"])
    assert all(lo <= d["tokens"] <= hi and d["modules"] for d in manifest["calibration"] + manifest["heldout"])


def test_corpus_is_deterministic_and_disjoint(tmp_path):
    tok = WordTokenizer()
    m = write_demo_corpus(tmp_path / "a", 6, 3, tok, min_tokens=800, max_tokens=1600)
    write_demo_corpus(tmp_path / "b", 6, 3, tok, min_tokens=800, max_tokens=1600)
    _check(tmp_path / "a", tmp_path / "b", m, 6, 3, 800, 1600)
    assert m["modules"]["calibration"][0] == "argparse" and m["python"]


def test_corpus_says_when_the_text_runs_out(tmp_path):
    with pytest.raises(ValueError, match="asked for 100000"):
        write_demo_corpus(tmp_path, 100_000, 1, WordTokenizer())
