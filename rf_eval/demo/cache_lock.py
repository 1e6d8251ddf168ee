"""One process at a time builds a demo cache entry; the others wait and then reuse it.

The demo's caches (the converted model, its fitted maps) are published atomically by a rename, so a
reader never sees half an entry; without a lock, though, two processes that start on an empty cache
(parallel test workers, two `pretrained=demo` arms launched together) each spend minutes building the
same entry. `building(target)` holds an exclusive `flock` on a lock file for `target` (in a `locks`
folder beside the cache's entry folders, so that listing those finds only entries) for as long as the
caller builds; the caller checks again for a finished entry once it holds the lock. Where `fcntl`
is missing (Windows), it does not lock: the rename still keeps every entry whole.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def building(target: Path) -> Iterator[None]:
    """Hold the lock for building `target`, a cache entry `<root>/<kind>/<name>`; the lock file is
    `<root>/locks/<kind>-<name>.lock`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    path = lock_path(target)
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process that is building %s", target)
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log.warning("the other process finished %s after %.0f s", target, time.monotonic() - started)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_path(target: Path) -> Path:
    """The lock file for the cache entry `target`."""
    return target.parent.parent / "locks" / f"{target.parent.name}-{target.name}.lock"
