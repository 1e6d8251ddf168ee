"""`rf-eval fetch-data`: download what the named rf-eval tasks read from the network into a data folder,
with the sources' own fetchers (`rf_eval.tasks.data.SOURCES`) and a manifest (sha256, host, time)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rf_eval.errors import UserError
from rf_eval.tasks.data import LONGBENCH_DATASET, MANIFEST, SOURCES, source_sha256, write_text
from rf_eval.tasks.data_files import check_fields, read_json
from rf_eval.tasks.data_needs import sources_of, task_configs
from rf_eval.tasks.ruler_data import ruler_module


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
                                                 if task in ("keytoken_nll", "decode_agreement") else ""))
    for name in wanted:
        source, target = SOURCES[name], out / SOURCES[name].path
        if target.exists() and not force:
            log(f"{name}: {target} is there (kept; --force downloads it again)")
            continue
        log(f"{name}: downloading {source.what} from {source.host}")
        t0 = time.time()
        try:
            FETCHERS[name](out)
        except Exception as err:
            raise UserError(f"fetch-data: could not download {source.what} from {source.host} "
                            f"({type(err).__name__}: {err}); run it where the network is reachable") from err
        manifest["sources"][name] = {"path": source.path, "sha256": source_sha256(target), "host": source.host,
                                     "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "seconds": round(time.time() - t0, 1)}
        write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
        log(f"{name}: wrote {target}")
    write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


# ---- fetchers: the tasks' own download functions, their results written to files


def _ruler(name: str):
    return ruler_module(name)


def _fetch_essays(folder: Path) -> None:
    words = _ruler("prepare_niah").get_haystack(type_haystack="essay")
    # one text file that `ruler_data.essay_haystack` splits back into exactly these words
    write_text(folder / "paul_graham_essays.txt", " ".join(words))


def _fetch_punkt(folder: Path) -> None:
    import nltk

    target = folder / "nltk_data"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-nltk-", dir=folder))
    try:
        if not nltk.download("punkt_tab", download_dir=str(tmp), quiet=True, raise_on_error=True):
            raise OSError("nltk could not download punkt_tab")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _qa_url(reader: str) -> str:
    """The URL lm-eval's RULER QA reader downloads (its `url` default)."""
    return inspect.signature(getattr(_ruler("qa_utils"), reader)).parameters["url"].default


def _fetch_qa(reader: str, name: str) -> Callable[[Path], None]:
    def fetch(folder: Path) -> None:
        data = _ruler("qa_utils").download_json(_qa_url(reader))
        write_text(folder / name, json.dumps(data))

    return fetch


def _fetch_longbench(folder: Path) -> None:
    import datasets

    items = datasets.load_dataset(LONGBENCH_DATASET, split="train").to_list()
    write_text(folder / "longbench_v2.json", json.dumps(items, ensure_ascii=False))


FETCHERS: dict[str, Callable[[Path], None]] = {
    "essays": _fetch_essays,
    "punkt_tab": _fetch_punkt,
    "squad": _fetch_qa("read_squad", "squad.json"),
    "hotpotqa": _fetch_qa("read_hotpotqa", "hotpotqa.json"),
    "longbench_v2": _fetch_longbench,
}
