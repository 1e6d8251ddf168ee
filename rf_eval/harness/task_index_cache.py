"""A disk cache for lm-eval's task index, valid while no YAML file it read has changed.

Every `lm_eval` process starts by parsing each of lm-eval's ~14,000 task YAML
files (`TaskIndex.build`): 10-15 s on a laptop-class CPU, paid again by every
arm of a study. The index is a pure function of the files that build opens
and of the folders' listings, so this module stores it, under a key of lm-eval's
version, Python's and the root, with the size and sha256 of the content of every
such file and the listing of every root, and reuses it only when all of them are
unchanged; any difference rebuilds it (and rewrites it). Checking the ~14,000
files' content takes about 0.4 s, against 10-15 s for the build.

On by default, at `cache_root()/lm-eval-task-index`; `RF_EVAL_TASK_INDEX_CACHE`
names another folder, or switches it off (`off`, `0` or empty). The startup hook (`rf_eval.model_adapters.startup`) installs `wrap_build`
when lm-eval's index module loads; any error in the cache falls back to
lm-eval's own build.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from rf_eval.files.cache_folder import CacheFolder

log = logging.getLogger(__name__)
ENV = "RF_EVAL_TASK_INDEX_CACHE"
FORMAT = 2  # 2: files recorded by their content's sha256, not their mtime


CACHE = CacheFolder(ENV, "lm-eval-task-index", on_by_default=True)
default_folder, child_env, folder_from_env = CACHE.default_folder, CACHE.child_env, CACHE.folder_from_env


def _stat(path: str) -> tuple[int, str] | None:
    """The file's size and its content's sha256 (None: unreadable), what a cached index is valid for."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return len(data), hashlib.sha256(data).hexdigest()


def _listing(root: Path) -> list[str]:
    """Every .yaml file under `root`: a superset of what lm-eval's index walks (it skips a few folders),
    so any file added or removed there changes the listing."""
    found = []
    for folder, _, names in os.walk(root, followlinks=True):
        found += [os.path.join(folder, n) for n in names if n.endswith(".yaml")]
    return sorted(found)


def _key(root: Path, resolve_includes: bool) -> str:
    import lm_eval

    # the root as spelled (the index's paths keep its spelling); a relative one with the folder it is relative to
    spelled = str(root) if root.is_absolute() else f"{os.getcwd()}|{root}"
    parts = [str(FORMAT), lm_eval.__version__, sys.version, str(resolve_includes), spelled]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _load(path: Path, listing: list[str]) -> dict | None:
    try:
        with open(path, "rb") as fh:
            stored = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    if not isinstance(stored, dict) or stored.get("listing") != listing:
        return None
    if any(_stat(name) != signature for name, signature in stored["files"].items()):
        return None
    return stored["index"]


def _save(path: Path, listing: list[str], files: set[str], index: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"listing": listing, "files": {name: _stat(name) for name in sorted(files)}, "index": index}
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(record, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: parallel arms never read half a file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _root_index(original: Callable, folder: Path, root: Path, resolve_includes: bool) -> dict:
    """lm-eval's index of one root, from `folder` when every file it read and the root's listing are unchanged."""
    from lm_eval.tasks import _index, _yaml_loader

    listing = _listing(root)
    path = folder / f"{_key(root, resolve_includes)}.pickle"
    found = _load(path, listing)
    if found is not None:
        return found
    opened: set[str] = set()
    loader = _yaml_loader.load_yaml

    def recording(p, *args, **kwargs):  # includes recurse through the module global: all are seen
        opened.add(str(Path(p).expanduser().resolve()))
        return loader(p, *args, **kwargs)

    _yaml_loader.load_yaml = _index.load_yaml = recording
    try:
        index = original([root], resolve_includes=resolve_includes)
    finally:
        _yaml_loader.load_yaml = _index.load_yaml = loader
    _save(path, listing, opened, index)
    return index


def cached_build(original: Callable, folder: Path, paths, resolve_includes: bool = True) -> dict:
    """`original(paths, resolve_includes=...)`, each root's part read from `folder` while unchanged.

    Roots are cached one by one (lm-eval's own tasks, shared by every run, apart from a run's
    --include_path) and merged as lm-eval merges them: a later root's task replaces an earlier one's.
    """
    index: dict = {}
    for root in map(Path, paths):
        for name, entry in _root_index(original, folder, root, resolve_includes).items():
            if name in index:
                log.warning("task %r from %s replaces the one from %s", name, entry.yaml_path,
                            index[name].yaml_path)
            index[name] = entry
    return index


def wrap_build(index_module) -> None:
    """Make `TaskIndex.build` use the cache unless `RF_EVAL_TASK_INDEX_CACHE` switches it off."""
    cls = index_module.TaskIndex
    original = cls.build
    if getattr(original, "_rf_eval", False):
        return

    def build(paths, *, resolve_includes=True):
        folder = folder_from_env()
        if folder is None:
            return original(paths, resolve_includes=resolve_includes)
        paths = list(paths)
        try:
            return cached_build(original, folder, paths, resolve_includes)
        except Exception:  # a cache must never break lm-eval: build as if it were off
            return original(paths, resolve_includes=resolve_includes)

    build._rf_eval = True
    build.__wrapped__ = original
    cls.build = staticmethod(build)
