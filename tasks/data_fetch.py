"""`rf-eval fetch-data`: download what the named rf-eval tasks read from the network into a data folder,
with the sources' own fetchers (`rf_eval.tasks.data.SOURCES`) and a manifest (sha256, host, time)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rf_eval.errors import UserError
from rf_eval.tasks.data import MANIFEST, SOURCES, sources_of, task_configs, write_text


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
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"sources": {}}
    wanted = list(dict.fromkeys(n for t in tasks for n in sources_of(configs[t])))
    for task in tasks:
        if not sources_of(configs[task]):
            log(f"{task}: downloads nothing" + (" (it reads your own documents: `docs`)"
                                                 if task in ("keytoken_nll", "decode_agreement") else ""))
    for name in wanted:
        source, target = SOURCES[name], out / SOURCES[name].path
        if target.exists() and not force:
            log(f"{name}: {target} is there (kept; --force downloads it again)")
            continue
        log(f"{name}: downloading {source.what} from {source.host}")
        t0 = time.time()
        try:
            source.fetch(out)
        except Exception as err:
            raise UserError(f"fetch-data: could not download {source.what} from {source.host} "
                            f"({type(err).__name__}: {err}); run it where the network is reachable") from err
        manifest["sources"][name] = {"path": source.path, "sha256": _sha256(target), "host": source.host,
                                     "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "seconds": round(time.time() - t0, 1)}
        write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
        log(f"{name}: wrote {target}")
    write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def _sha256(path: Path) -> str:
    """A file's sha256 (what `sha256sum` prints); a folder's over its files' relative paths and sha256s."""
    from rf_eval.hashing import file_sha256, named_files_sha256

    if path.is_file():
        return file_sha256(path)
    return named_files_sha256(sorted(p for p in path.rglob("*") if p.is_file()), root=path)
