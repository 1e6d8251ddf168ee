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


def _sweep_module():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_sweep.py"
    spec = importlib.util.spec_from_file_location("demo_sweep_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_development_and_report_text_are_disjoint_and_the_sweep_reads_development_only(tmp_path):
    """Issue #42 item 3: the demo's settings are chosen on development text, its tables measured on report
    text; the two share no module, no paragraph and no document."""
    from rf_eval.demo.corpus import DEVELOPMENT, REPORT

    tok = WordTokenizer()
    manifest = write_demo_corpus(tmp_path / "both", 0, 8, tok, n_evaluation=8, min_tokens=800, max_tokens=1600)
    development, report = _read(tmp_path / "both", DEVELOPMENT), _read(tmp_path / "both", REPORT)
    assert len(development) == len(report) == 8
    assert not set(manifest["modules"][DEVELOPMENT]) & set(manifest["modules"][REPORT])
    assert not {p for d in development for p in d.split("\n\n")} & {p for d in report for p in d.split("\n\n")}
    assert not {d["sha256"] for d in manifest[DEVELOPMENT]} & {d["sha256"] for d in manifest[REPORT]}
    swept = _sweep_module().development_documents(tok, tmp_path / "sweep", 8, 800, 1600)
    assert swept == development and not set(swept) & set(report)


def test_the_demo_reads_report_needles_and_the_sweep_development_needles(tiny_model_dir):
    """The demo's study takes the first samples of each length (balanced order), the quality tests the first
    filled ones: all among the first REPORT_NEEDLES; the sweep's come after them."""
    from transformers import AutoTokenizer

    from rf_eval.demo import quality
    from rf_eval.demo.study import settings

    assert all(settings(q).samples_per_length <= quality.REPORT_NEEDLES for q in (True, False))
    path = tiny_model_dir("llama")
    tok = AutoTokenizer.from_pretrained(path)
    report = quality.needle_samples(tok, path, (512,), 4, 64, filled_only=False)
    development = quality.needle_samples(tok, path, (512,), 4, 64, filled_only=False, development=True)
    assert [s.index for s in report] == [0, 1, 2, 3]
    assert len(development) == 4 and min(s.index for s in development) >= quality.REPORT_NEEDLES
    assert not {tuple(s.ids[0].tolist()) for s in report} & {tuple(s.ids[0].tolist()) for s in development}
