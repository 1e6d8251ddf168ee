"""The RULER samples cache: a hit gives the generator's samples exactly, without running it; the key moves with
everything the generator reads; file-backed tasks are never cached; a broken entry is generated again."""

from __future__ import annotations

import gzip
import logging
import shutil

import pytest
from transformers import AutoTokenizer

from rf_eval.tasks import ruler_cache, ruler_data

LENGTHS = [1024]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "samples"
    monkeypatch.setenv(ruler_cache.ENV, str(folder))
    return folder


def meta(tokenizer, **extra):
    return {"pretrained": tokenizer, "max_seq_lengths": LENGTHS, **extra}


def no_generator(monkeypatch):
    """Any call into lm-eval's RULER modules from here on fails the test."""
    def refuse(name):
        raise AssertionError(f"lm-eval's generator ran ({name}) on a cache hit")

    monkeypatch.setattr(ruler_data, "ruler_module", refuse)


def same(a, b) -> bool:
    return a.features == b.features and str(a.split) == str(b.split) and a.to_list() == b.to_list()


def test_a_hit_is_the_generators_samples_without_running_it(tiny_llama, cache, monkeypatch):
    monkeypatch.setenv(ruler_cache.ENV, "off")
    fresh = ruler_data.generate("niah_single_1", meta(tiny_llama))["test"]
    monkeypatch.setenv(ruler_cache.ENV, str(cache))
    stored = ruler_data.generate("niah_single_1", meta(tiny_llama))["test"]  # a miss: generated, then written
    assert same(stored, fresh) and len(list(cache.glob("*.json.gz"))) == 1
    no_generator(monkeypatch)
    again = ruler_data.generate("niah_single_1", meta(tiny_llama))["test"]
    assert same(again, fresh) and len(fresh) == 500


def test_the_key_moves_with_what_the_generator_reads(tiny_model_dir, tmp_path):
    llama = tiny_model_dir("llama")
    copy = shutil.copytree(llama, tmp_path / "same_tokenizer_elsewhere")
    changed = tmp_path / "one_token_more"
    tokenizer = AutoTokenizer.from_pretrained(llama)
    tokenizer.add_tokens(["zzqx"])
    tokenizer.save_pretrained(changed)
    key = ruler_cache.sample_key("niah_single_1", meta(llama), 0, 1234)
    assert ruler_cache.sample_key("niah_single_1", meta(str(copy)), 0, 1234) == key  # content, not path
    assert len({key,
                ruler_cache.sample_key("niah_single_2", meta(llama), 0, 1234),
                ruler_cache.sample_key("niah_single_1", meta(llama, max_seq_lengths=[2048]), 0, 1234),
                ruler_cache.sample_key("niah_single_1", meta(llama), 1, 1234),
                ruler_cache.sample_key("niah_single_1", meta(llama), 0, 1),
                ruler_cache.sample_key("niah_single_1", meta(str(changed)), 0, 1234)}) == 6
    # model_args the generator does not read (the arm's fill, its tail) share the samples
    assert ruler_cache.sample_key("niah_single_1", meta(llama, fill="ridge", tail=300), 0, 1234) == key
    # and so does the truncation and padding an earlier call left set on the generator's tokenizer
    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    get_tokenizer(llama)("a few words", truncation=True, max_length=3, padding="max_length")
    assert ruler_cache.sample_key("niah_single_1", meta(llama), 0, 1234) == key


@pytest.mark.parametrize("task", ["niah_single_2", "ruler_qa_squad"])
def test_tasks_that_read_data_files_are_never_cached(task, cache, monkeypatch):
    """The essay haystack and the QA sources are files or downloads the key cannot see."""
    called = []
    monkeypatch.setattr(ruler_cache, "sample_key", lambda *a: called.append(a))
    monkeypatch.setattr(ruler_data, "local_sources", _stop_before_generating)
    with pytest.raises(_Stopped):
        ruler_data.generate(task, {"tokenizer": "unused", "max_seq_lengths": LENGTHS})
    assert called == [] and not cache.exists()


class _Stopped(Exception):
    pass


def _stop_before_generating(metadata, base_task):
    raise _Stopped


def test_a_broken_entry_is_generated_again_and_rewritten(tiny_llama, cache, caplog):
    first = ruler_data.generate("niah_single_1", meta(tiny_llama))["test"]
    (entry,) = cache.glob("*.json.gz")
    entry.write_bytes(gzip.compress(b'{"rows": [')[:-3])  # a truncated write
    with caplog.at_level(logging.WARNING, logger="lm_eval.rf_eval.ruler_cache"):
        again = ruler_data.generate("niah_single_1", meta(tiny_llama))["test"]
    assert same(again, first) and "is unreadable" in caplog.text and str(entry) in caplog.text
    assert ruler_cache.load(ruler_cache.sample_key("niah_single_1", meta(tiny_llama), 0, 1234)) is not None


def test_off_reads_and_writes_nothing(tiny_llama, tmp_path, monkeypatch):
    for value in ("off", "", "0"):
        monkeypatch.setenv(ruler_cache.ENV, value)
        assert ruler_cache.folder_from_env() is None
    assert ruler_cache.child_env({}) == {ruler_cache.ENV: str(ruler_cache.default_folder())}
    assert ruler_cache.child_env({ruler_cache.ENV: "off"}) == {ruler_cache.ENV: "off"}  # the user's choice stays
