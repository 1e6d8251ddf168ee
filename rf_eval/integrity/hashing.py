"""File hashing, in one place: what every fingerprint, manifest and ledger entry records of files.

`file_sha256` is what `sha256sum` prints (read in chunks); `named_files_sha256` digests a list of files
as (name, file digest) pairs, the name relative to a root folder, so renaming or moving a file changes
it; `sha256_of_files` digests the files' bytes one after another (names left out); `file_sha256_and_lines`
adds the size and line count that a results seal records (`rf_eval.integrity.seal`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

CHUNK = 1 << 22


def _feed(digest: hashlib._Hash, path: str | Path) -> hashlib._Hash:
    """`digest` updated with a file's bytes, read in chunks."""
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest


def _digest(path: str | Path) -> hashlib._Hash:
    return _feed(hashlib.sha256(), path)


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    return _digest(path).hexdigest()


def named_files_sha256(files: Iterable[str | Path], root: str | Path | None = None) -> str:
    """sha256 over each file's name (relative to `root`, else its own name) and its sha256, in order."""
    digest = hashlib.sha256()
    for raw in files:
        path = Path(raw)
        name = path.relative_to(root).as_posix() if root is not None else path.name
        digest.update(name.encode())
        digest.update(_digest(path).digest())
    return digest.hexdigest()


def sha256_of_files(paths: Sequence[str | Path]) -> str:
    """One digest over the files' bytes, in the order given."""
    digest = hashlib.sha256()
    for raw in paths:
        _feed(digest, raw)
    return digest.hexdigest()


def file_sha256_and_lines(path: str | Path) -> tuple[str, int, int]:
    """(sha256 hex, bytes, newline count) of a file, read once: what a results seal records (`rf_eval.integrity.seal`)."""
    digest, size, lines = hashlib.sha256(), 0, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
    return digest.hexdigest(), size, lines
