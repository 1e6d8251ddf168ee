"""What a piece of downloaded task data is (`DataSource`); the registry is `rf_eval.tasks.data_sources`."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from rf_eval.errors import UserError
from rf_eval.files.data_files import read_json
from rf_eval.integrity.hashing import file_sha256, named_files_sha256

MANIFEST = "manifest.json"  #: what `rf-eval fetch-data` records in a data folder

_hashed: dict[tuple[str, str], tuple[int, str]] = {}  # (folder, source) -> (files' stamp, sha256 found)


def source_sha256(path: Path) -> str:
    """A file's sha256 (what `sha256sum` prints); a folder's over its files' relative paths and sha256s."""
    if path.is_file():
        return file_sha256(path)
    return named_files_sha256(sorted(p for p in path.rglob("*") if p.is_file()), root=path)


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class DataSource:
    """One piece of data rf-eval's tasks download: its `name` (the manifest's and fetch-data's), `what` it is
    in words (for messages), the `path` it takes in a data folder (a file or a folder), the metadata `option`
    that names a local copy instead (None: none), the `host` it downloads from, and

    - which tasks need it (`needed_by`): by default a task whose class is one of `task_classes`, or a RULER
      task built on one of `ruler_tasks`;
    - how to fetch it into a data folder (`fetch`, through the tasks' own download functions);
    - how a run finds it without a data folder: installed where its library looks (`installed`), or, offline,
      in the hub's cache (`cached`); a `local_only` piece is read from a local copy only;
    - how a data folder's copy is checked (`check`: against the folder's manifest) and what the manifest
      records of it (`manifest_entry`).
    """

    name: ClassVar[str] = ""
    what: ClassVar[str] = ""
    path: ClassVar[str] = ""
    option: ClassVar[str | None] = None
    host: ClassVar[str] = ""
    local_only: ClassVar[bool] = False
    hint: ClassVar[str] = ""  #: another place a run finds it, for the missing-data message
    task_classes: ClassVar[tuple[str, ...]] = ()
    ruler_tasks: ClassVar[frozenset[str]] = frozenset()

    def needed_by(self, task_class: str, ruler_tasks: Sequence[str]) -> bool:
        """Whether a task of class `task_class` (its YAML's `class`, last part) built on the RULER tasks
        `ruler_tasks` (none for a task that is not RULER's) reads this piece."""
        return task_class in self.task_classes or any(t in self.ruler_tasks for t in ruler_tasks)

    def fetch(self, folder: Path) -> None:
        """Download this piece to `folder / self.path`."""
        raise NotImplementedError

    def installed(self) -> bool:
        """Whether a run finds it without a data folder or the network (its library's own install)."""
        return False

    def cached(self) -> bool:
        """Offline: whether the tasks' own download finds it in a cache."""
        return False

    def check(self, folder: Path) -> None:
        """Refuse a data-folder copy whose sha256 is not the one `rf-eval fetch-data` recorded in the folder's
        manifest (a file edited or replaced since: the run would score data that is not what was fetched). A
        folder without a manifest, or a piece it does not list, is the user's own and is read as it is. Each
        piece is hashed once per process, and again only when it or the manifest changes (mtime, size)."""
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file():
            return
        recorded = (read_json(manifest_path, MANIFEST).get("sources") or {}).get(self.name) or {}
        want = recorded.get("sha256") if isinstance(recorded, dict) else None
        if not want:
            return
        piece = folder / self.path
        files = [piece] if piece.is_file() else sorted(p for p in piece.rglob("*") if p.is_file())
        key = (str(folder.resolve()), self.name)
        stamp = hash((manifest_path.stat().st_mtime_ns,
                      *((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)))
        if key in _hashed and _hashed[key][0] == stamp:
            found = _hashed[key][1]
        else:
            found = source_sha256(piece)
            _hashed[key] = (stamp, found)
        if found != want:
            raise UserError(f"{piece}: its sha256 {found[:12]}... is not the {want[:12]}... that fetch-data "
                            f"recorded in {manifest_path} (edited or replaced since); fetch it again "
                            f"(rf-eval fetch-data ... --out {folder} --force) or restore it")

    def manifest_entry(self, folder: Path, seconds: float) -> dict[str, Any]:
        """What the manifest records of this piece, just fetched into `folder` in `seconds`."""
        return {"path": self.path, "sha256": source_sha256(folder / self.path), "host": self.host,
                "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(seconds, 1)}
