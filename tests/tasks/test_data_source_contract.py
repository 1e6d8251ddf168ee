"""Every registered data source keeps the data-source contract (kvpress's `default_presses` idea, issue #39
item 3).

The list is the registry's (`rf_eval.tasks.data_sources.SOURCES`), so a new source, in the package or in a
folder on RF_EVAL_DATA_SOURCE_PATH, is tested here the moment it is found (tests/test_throwaway_plugins.py runs
a throwaway one). Each (the package's own with the network's download functions stood in, `stand_in_sources`)
is fetched into a data folder by `rf-eval fetch-data`'s own code, recorded in the manifest with its sha256,
found there by a run that is offline, refused once its copy is edited, and named (what it is, its option) in
the message of a task that lacks it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rf_eval.errors import UserError
from rf_eval.tasks import data, data_fetch, data_needs, data_sources
from rf_eval.tasks.data_sources import SOURCES, source
from rf_eval.tasks.data_sources.base import MANIFEST, source_sha256


def edit(path: Path) -> None:
    """Change one byte of the piece at `path` (its first file, for a folder)."""
    target = path if path.is_file() else next(p for p in sorted(path.rglob("*")) if p.is_file())
    target.write_bytes(target.read_bytes() + b"\n")


def shipped(name: str) -> bool:
    """Whether source `name` is one of the package's own (their download functions are stood in)."""
    return Path(sys.modules[SOURCES[name].__module__].__file__).parent == Path(data_sources.__file__).parent


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_data_source_keeps_the_contract(name, no_punkt, monkeypatch, tmp_path, request):
    if shipped(name):  # lm-eval's RULER modules take seconds to import: only for the sources that call them
        request.getfixturevalue("stand_in_sources")
    piece = source(name)
    assert piece.name == name and piece.what and piece.path and piece.host
    assert not Path(piece.path).is_absolute() and ".." not in Path(piece.path).parts
    needing = [t for t, c in data_needs.task_configs().items() if name in data_needs.sources_of(c)]
    if needing:  # fetch-data downloads it for the tasks that read it
        out = tmp_path / "data"
        manifest = data_fetch.fetch(needing[:1], out, log=lambda line: None)
        assert manifest == json.loads((out / MANIFEST).read_text())
    else:  # a source no shipped task reads yet (a throwaway on the path): fetched directly
        out = tmp_path / "data"
        out.mkdir()
        piece.fetch(out)
        entry = piece.manifest_entry(out, 0.0)
        (out / MANIFEST).write_text(json.dumps({"sources": {name: entry}}))
        manifest = {"sources": {name: entry}}
    entry = manifest["sources"][name]
    assert entry["path"] == piece.path and entry["host"] == piece.host
    assert entry["sha256"] == source_sha256(out / piece.path)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = {"data_dir": str(out)}
    assert data.local_copy(name, folder) == out / piece.path and data.available(name, folder)
    if piece.option:  # a named local copy wins over the data folder
        assert data.local_copy(name, {**folder, piece.option: "/elsewhere"}) == Path("/elsewhere")
    edit(out / piece.path)
    with pytest.raises(UserError, match=f"{piece.path}: its sha256 .* that fetch-data recorded"):
        data.local_copy(name, folder)

    message = data.missing_message("some_task", [name], data.why_missing([name]))
    assert piece.what in message and "rf-eval fetch-data --tasks some_task --out DIR" in message
    assert (f'"{piece.option}": "PATH"' in message) == bool(piece.option) and "\n" not in message
