"""`rf-eval fetch-data`: download what the named rf-eval tasks read from the network into a data folder,
with the sources' own fetchers (`rf_eval.tasks.data_sources`: each piece's `fetch`) and a manifest (sha256,
host, time)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rf_eval.errors import UserError
from rf_eval.files.data_files import check_fields, read_json
from rf_eval.tasks.data_needs import DOCS_TASKS, sources_of, task_configs
from rf_eval.tasks.data_sources import source
from rf_eval.tasks.data_sources.base import MANIFEST, write_text


def fetch(tasks: Iterable[str], out: Path, *, force: bool = False, log: Callable[[str], None] = print) -> dict:
    """Download what `tasks` need into `out`; returns the manifest written there. Pieces already there are
    kept unless `force`."""
    tasks = list(tasks)
    configs = task_configs()
    unknown = [t for t in tasks if t not in configs]
    if unknown:
        raise UserError(f"fetch-data: {', '.join(map(repr, unknown))} is not an rf-eval task; valid: "
                        f"{', '.join(sorted(configs))}")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = read_json(manifest_path, MANIFEST) if manifest_path.is_file() else {"sources": {}}
    check_fields(manifest, {"sources": dict}, str(manifest_path),
                 'a fetch-data manifest holds {"sources": {...}} (delete it, or give --out a new folder)')
    wanted = list(dict.fromkeys(n for t in tasks for n in sources_of(configs[t])))
    for task in tasks:
        if not sources_of(configs[task]):
            log(f"{task}: downloads nothing" + (" (it reads your own documents: `docs`)"
                                                 if task in DOCS_TASKS else ""))
    for name in wanted:
        piece = source(name)
        target = out / piece.path
        if target.exists() and not force:
            log(f"{name}: {target} is there (kept; --force downloads it again)")
            continue
        log(f"{name}: downloading {piece.what} from {piece.host}")
        t0 = time.time()
        try:
            piece.fetch(out)
        except Exception as err:
            raise UserError(f"fetch-data: could not download {piece.what} from {piece.host} "
                            f"({type(err).__name__}: {err}); run it where the network is reachable") from err
        manifest["sources"][name] = piece.manifest_entry(out, time.time() - t0)
        write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
        log(f"{name}: wrote {target}")
    write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest
