"""lm-eval's RULER modules, imported so that an offline start neither downloads nor lies, and the tasks
whose haystack is the essays: what the RULER data sources (`essays`, `punkt_tab`, `squad`, `hotpotqa`), the
RULER tasks (`rf_eval.tasks.ruler_data`) and the tests' warm starter (tests/warm_start.py, which preloads
the generator) all read. A root module that imports nothing of rf-eval's and reads no variable at import,
so that each of them can import it without the others' packages."""

from __future__ import annotations

import importlib
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from types import ModuleType
from typing import Any

#: tasks whose haystack is the Paul Graham essays (lm-eval's `get_haystack(type_haystack="essay")`), which
#: need the essays and nltk's punkt_tab (`rf_eval.tasks.data`)
ESSAY_HAYSTACK = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")


def offline() -> bool:
    """Whether the hub is switched off (`HF_HUB_OFFLINE`), as `huggingface_hub` reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@contextmanager
def patched(module: Any, name: str, value: Any) -> Iterator[None]:
    """`module.name` is `value` inside the block, and what it was after."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def ruler_module(name: str) -> ModuleType:
    """lm-eval's RULER module `name`. Importing `prepare_niah` (which `niah_utils` does) asks nltk to
    download `punkt_tab` when it is missing, for every RULER task, and lm-eval then prints "Downloaded
    punkt_tab" whether or not anything was (offline, or without a network, after nltk's error). So the
    import runs with nltk's downloader off and its output unprinted; only the tasks that need the model
    (the essay haystack) call `check_punkt`, which fetches it or says what is missing and how to get it.
    (The import's 12-13 s here are lm-eval's own word list, built at import, not the download.)"""
    module = f"lm_eval.tasks.ruler.{name}"
    if module in sys.modules:
        return importlib.import_module(module)
    import nltk

    with patched(nltk, "download", lambda *args, **kwargs: False), redirect_stdout(io.StringIO()):
        return importlib.import_module(module)
