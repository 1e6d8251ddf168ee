"""A disk cache of lm-eval's RULER samples: a study generates each task's samples once, not once per arm.

lm-eval keeps no samples between processes, so every arm of a study ran lm-eval's RULER generator again
over the same tokenizer and lengths (and the study runner once more to check the data first): at 8k-32k
tokens that is minutes of tokenizing per task while the GPU waits, and each process also pays lm-eval's
12-13 s import of its word list (`prepare_niah`). The samples are a pure function of what the generator
reads, so this module stores them under a key of exactly that:

- the task, `max_seq_lengths`, and the `seed`/`numpy_seed` the generation runs under (`ruler_data.seeded`);
- the tokenizer lm-eval's generator loads (`get_tokenizer`), by content: its class and its whole serialized
  state (`backend_tokenizer.to_str()`), so two folders holding the same tokenizer share samples and a
  changed tokenizer file never does; a tokenizer without that state (a slow one) is not cached;
- the source of lm-eval's RULER modules and of rf-eval's seeding around them, and the word list's
  package version: a changed generator is a new key.

The tasks whose haystack or questions come from data files or downloads (the essay haystack, SQuAD,
HotpotQA) are never cached: this key cannot see what those sources hold.

Off unless `RF_EVAL_RULER_CACHE` names a folder (`off` or empty: off); `rf-eval study` and `rf-eval demo`
turn it on for their own build and their arms (`child_env`, the default folder under rf-eval's cache). An
unreadable entry is generated again (and rewritten), never an error.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from rf_eval.files.cache_folder import CacheFolder
from rf_eval.harness import lm_eval_ruler
from rf_eval.tasks.common import tokenizer_name

log = logging.getLogger("lm_eval.rf_eval.ruler_cache")  # shown in lm-eval's own log of the run
ENV = "RF_EVAL_RULER_CACHE"
FORMAT = 1


CACHE = CacheFolder(ENV, "ruler-samples")
default_folder, child_env, folder_from_env = CACHE.default_folder, CACHE.child_env, CACHE.folder_from_env


@functools.cache  # the files do not change under a running process; a study's build keys several tasks
def _generator_sources() -> str:
    """sha256 over lm-eval's RULER module files, rf-eval's seeding around them and the word list's version."""
    h = hashlib.sha256()
    spec = find_spec("lm_eval.tasks.ruler")
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    here = Path(__file__).resolve().parent
    files = [f for folder in folders for f in sorted(folder.glob("*.py"))]
    files += [here / "ruler_data.py", Path(lm_eval_ruler.__file__).resolve()]
    for file in files:
        h.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    for package in ("lm_eval", "wonderwords"):
        try:
            h.update(f"{package}={version(package)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{package}=none\0".encode())
    return h.hexdigest()


def sample_key(base_task: str, metadata: dict[str, Any], seed: int, numpy_seed: int) -> str | None:
    """The cache key of `base_task`'s samples under `metadata` (see the module docstring); None when the
    tokenizer has no serialized state to key on."""
    from lm_eval.tasks.ruler.common_utils import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_name(metadata))  # the generator's own (lm-eval caches it per name)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    # the tokenizer's vocabulary, models and pipeline; not the truncation and padding an earlier call left
    # set on it (each call of a fast tokenizer sets its own)
    state = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
    h = hashlib.sha256()
    parts = (FORMAT, base_task, json.dumps(metadata.get("max_seq_lengths"), default=str), seed, numpy_seed,
             type(tokenizer).__name__, json.dumps(state, sort_keys=True), _generator_sources())
    for part in parts:
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()


def _path(key: str) -> Path | None:
    folder = folder_from_env()
    return folder / f"{key}.json.gz" if folder else None


def load(key: str) -> dict[str, Any] | None:
    """The samples stored under `key` ({"test": Dataset}, as the generator returns them), else None."""
    path = _path(key)
    if path is None or not path.is_file():
        return None
    import datasets

    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            record = json.load(fh)
        features = datasets.Features.from_dict(record["features"])
        test = datasets.Dataset.from_list(record["rows"], features=features, split=record["split"])
    except (OSError, EOFError, ValueError, KeyError, TypeError) as err:
        log.warning("RULER samples cache entry %s is unreadable (%s: %s); generating them again", path,
                    type(err).__name__, err)
        return None
    log.info("RULER samples read from %s (%s)", path, ENV)
    return {"test": test}


def store(key: str, result: dict[str, Any]) -> None:
    """Write the generator's result under `key` (atomically: a reader sees the old entry or the whole new one)."""
    path = _path(key)
    if path is None or set(result) != {"test"}:
        return
    test = result["test"]
    record = {"features": test.features.to_dict(), "split": str(test.split), "rows": test.to_list()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
    except OSError as err:  # a full or read-only disk costs the next process a generation, nothing more
        log.warning("RULER samples not cached at %s (%s)", path, err)
        tmp.unlink(missing_ok=True)
