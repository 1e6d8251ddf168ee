"""Calibration and held-out text for the demo's maps, offline and legal.

The text is the documentation strings of the running Python's own standard library (PSF licence),
gathered at run time with `inspect.getdoc` from a fixed list of modules in a fixed order; nothing is
shipped in the repository. Modules are split between three sets: every `HELDOUT_EVERY`-th module is
held out, and the held-out modules alternate between `heldout` and `evaluation`; paragraphs repeated
anywhere are kept once, so the sets share no text.

- `heldout` is the development text: it chooses the ridge penalty, and every setting the demo fixes
  (calibration size, lambda grid, split, document count) is chosen on it by `benchmarks/demo_sweep.py`
  (with the development needles, `rf_eval.demo.quality.REPORT_NEEDLES`).
- `evaluation` is the report text: the demo's tables, the README's figures and the quality tests measure
  on it; it is never fitted on and never used to choose anything (RidgeFill section 3: "a fix had to be
  a general rule, not a pattern matched to the test"). Documents are packed
from whole paragraphs to `min_tokens`..`max_tokens` tokens of the given tokenizer. The output is
deterministic for one Python version and tokenizer; the manifest records both and each document's
modules.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rf_eval.demo import model as demo_model

# Pure documentation-rich standard-library modules present on Python 3.10-3.14 (no GUI, no side effects).
MODULES = (
    "argparse", "ast", "asyncio", "base64", "binascii", "bz2", "calendar", "cmd", "codecs", "collections",
    "colorsys", "concurrent.futures", "configparser", "contextlib", "contextvars", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "dis", "doctest", "email.message", "email.utils",
    "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext",
    "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client",
    "http.cookiejar", "http.cookies", "http.server", "imaplib", "importlib", "inspect", "io", "ipaddress",
    "itertools", "json", "keyword", "linecache", "locale", "logging", "logging.handlers", "lzma",
    "mailbox", "math", "mimetypes", "modulefinder", "multiprocessing", "netrc", "numbers", "operator",
    "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "pkgutil", "platform", "plistlib",
    "poplib", "pprint", "profile", "pstats", "queue", "quopri", "random", "re", "reprlib", "runpy",
    "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket",
    "socketserver", "sqlite3", "ssl", "stat", "statistics", "string", "struct", "subprocess", "symtable",
    "sys", "sysconfig", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit",
    "token", "tokenize", "trace", "traceback", "tracemalloc", "types", "typing", "unicodedata",
    "unittest", "unittest.mock", "urllib.parse", "urllib.request", "uuid", "warnings", "wave",
    "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "xml.sax", "zipfile", "zlib", "zoneinfo",
)
HELDOUT_EVERY = 4
SETS = ("calibration", "heldout", "evaluation")
DEVELOPMENT, REPORT = "heldout", "evaluation"  # the sets settings are chosen on, and the set reported on
SEPARATOR = "\n\n"


def write_demo_corpus(
    out_dir: str | Path,
    n_calibration: int,
    n_heldout: int,
    tokenizer: Any = None,
    *,
    n_evaluation: int = 0,
    min_tokens: int = 2000,
    max_tokens: int = 4000,
) -> dict:
    """Write `calibration.jsonl`, `heldout.jsonl` and `evaluation.jsonl` (one `{"text": ...}` per line; a
    set asked for 0 documents writes no file) and `manifest.json`.

    `tokenizer` (a `transformers` tokenizer) defaults to the demo model's. Returns the manifest: per
    document its modules, token count and sha256, plus the Python version and the modules used.
    """
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(demo_model.demo_model_dir())

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    units = list(_paragraphs())
    pools: dict[str, list[tuple[str, str]]] = {name: [] for name in SETS}
    modules_seen: list[str] = []
    for module, text in units:
        if module not in modules_seen:
            modules_seen.append(module)
        pools[_set_of(modules_seen.index(module))].append((module, text))

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {
        "source": "docstrings of the Python standard library (PSF licence), via inspect.getdoc",
        "python": platform.python_version(),
        "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
        "min_tokens": min_tokens,
        "max_tokens": max_tokens,
    }
    for name, wanted in zip(SETS, (n_calibration, n_heldout, n_evaluation)):
        docs = list(_pack(pools[name], count, min_tokens, max_tokens, wanted))
        if len(docs) < wanted:
            raise ValueError(
                f"the standard library's docstrings give only {len(docs)} {name} documents of "
                f"{min_tokens}-{max_tokens} tokens; asked for {wanted}"
            )
        if wanted:
            with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
                for doc in docs:
                    f.write(json.dumps({"text": doc["text"]}, ensure_ascii=False) + "\n")
        manifest[name] = [{k: v for k, v in doc.items() if k != "text"} for doc in docs]
    manifest["modules"] = {name: sorted({m for doc in manifest[name] for m in doc["modules"]}) for name in SETS}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _set_of(module_index: int) -> str:
    """The set a module's paragraphs go to, by the module's order of first appearance."""
    if module_index % HELDOUT_EVERY != HELDOUT_EVERY - 1:
        return "calibration"
    return "heldout" if (module_index // HELDOUT_EVERY) % 2 == 0 else "evaluation"


def _pack(
    units: list[tuple[str, str]], count: Callable[[str], int], lo: int, hi: int, wanted: int
) -> Iterator[dict]:
    """Documents of whole paragraphs, each between `lo` and `hi` tokens, in order; at most `wanted`."""
    target = (lo + hi) // 2
    made, parts, modules, size = 0, [], [], 0
    for module, text in units:
        n = count(text)
        if n > hi - lo:  # a paragraph too long to place reliably: skipped
            continue
        if size + n > target and size >= lo:
            doc = _finish(parts, modules, count, lo, hi)
            if doc is not None:
                yield doc
                made += 1
                if made == wanted:
                    return
            parts, modules, size = [], [], 0
        parts.append(text)
        size += n + 1
        if module not in modules:
            modules.append(module)
    doc = _finish(parts, modules, count, lo, hi) if size >= lo else None
    if doc is not None:
        yield doc


def _finish(parts: list[str], modules: list[str], count: Callable[[str], int], lo: int, hi: int) -> dict | None:
    text = SEPARATOR.join(parts)
    n = count(text)
    if not lo <= n <= hi:
        return None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"text": text, "modules": modules, "tokens": n, "sha256": digest}


def _paragraphs() -> Iterator[tuple[str, str]]:
    """(module, paragraph) in a fixed order; a paragraph seen before (anywhere) is skipped."""
    seen: set[str] = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # e.g. a Python built without sqlite3, ssl or lzma
            continue
        for title, doc in _docs(module):
            for i, para in enumerate(p.strip() for p in doc.split("\n\n")):
                key = para
                if not para or key in seen:
                    continue
                seen.add(key)
                yield module_name, (f"{title}\n{para}" if i == 0 else para)


def _docs(module: Any) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) for the module, its public classes and functions, and their methods."""
    name = module.__name__
    doc = inspect.getdoc(module)
    if doc:
        yield name, doc
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        owner = getattr(obj, "__module__", None) or ""
        if owner != name and not owner.startswith(name + "."):
            continue
        doc = inspect.getdoc(obj)
        if doc:
            yield f"{name}.{attr}", doc
        if inspect.isclass(obj):
            for meth, member in sorted(vars(obj).items()):
                if meth.startswith("_") or not callable(getattr(obj, meth, None)):
                    continue
                doc = inspect.getdoc(member)
                if doc:
                    yield f"{name}.{attr}.{meth}", doc
