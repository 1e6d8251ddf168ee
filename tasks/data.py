"""The data rf-eval's tasks download, fetched ahead for machines without a network, and checked before a
run loads its model.

Some tasks read data from the network when they are built: the essay-haystack
RULER tasks the Paul Graham essays (lm-eval's `get_haystack`, from the hub)
and nltk's `punkt_tab` sentence model, the RULER QA tasks SQuAD's and
HotpotQA's JSON (lm-eval's `download_json`); `longbench_v2_cot` reads the
LongBench v2 items. On a node without a network (a cluster's compute node)
that fails, and lm-eval builds its tasks only after loading the model.

- `rf-eval fetch-data --tasks ... --out DIR` (`rf_eval.tasks.data_fetch`) downloads what the
  named tasks need into DIR, through the same lm-eval functions the tasks
  call, where the network is reachable, with a `manifest.json` (files,
  sha256, sources, time).
- The tasks read DIR when it is named in `--metadata '{"data_dir": DIR}'` or
  the RF_EVAL_DATA environment variable (`local_copy`). An option naming one
  file (`essay_haystack`, `squad_json`, `hotpotqa_json`, `data`) wins over DIR.
- `preflight(tasks, metadata)` runs before the model loads (rf-eval's
  startup hook calls it at the start of lm-eval's `simple_evaluate`; the
  study runner before its fit): a piece that is neither local nor reachable
  is one `UserError` line naming the fetch command and the local options.
  A piece is reachable when the network is (HF_HUB_OFFLINE unset and the
  source's host answers) or, offline, when the hub's datasets cache holds it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError

DATA_ENV = "RF_EVAL_DATA"
DATA_OPTION = "data_dir"
MANIFEST = "manifest.json"
LONGBENCH_DATASET = "THUDM/LongBench-v2"  # the dataset of the LongBench v2 paper, one `train` split


class TaskDataMissing(UserError):
    """A task's data is neither local nor downloadable here."""


@dataclass(frozen=True)
class Source:
    """One piece of downloaded data: where it lands in a data folder (its fetcher: `data_fetch.FETCHERS`)."""

    name: str
    what: str  # in words, for messages
    path: str  # file or folder inside the data folder
    option: str | None  # the metadata key naming a local copy instead
    host: str  # where it downloads from
    cached: Callable[[], bool] = lambda: False  # offline: whether the tasks' own download finds it cached


# ---- the pieces


def _essays_cached() -> bool:
    import datasets

    try:
        datasets.load_dataset("baber/paul_graham_essays", split="train")
    except Exception:  # not in the datasets cache (offline), or any hub error
        return False
    return True


def _punkt_installed() -> bool:
    """Whether nltk finds punkt_tab where it looks (NLTK_DATA, its default folders)."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return False
    return True


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("essays", "the Paul Graham essays (RULER's essay haystack)", "paul_graham_essays.txt",
           "essay_haystack", "huggingface.co", _essays_cached),
    Source("punkt_tab", "nltk's punkt_tab sentence model", "nltk_data", None, "raw.githubusercontent.com"),
    Source("squad", "SQuAD v2's dev set (RULER QA)", "squad.json", "squad_json", "rajpurkar.github.io"),
    Source("hotpotqa", "HotpotQA's dev set (RULER QA)", "hotpotqa.json", "hotpotqa_json", "huggingface.co"),
    Source("longbench_v2", "the LongBench v2 dataset", "longbench_v2.json", "data", "huggingface.co"),
)}


# ---- where a piece is


def data_dir(metadata: dict[str, Any] | None) -> Path | None:
    """The data folder: metadata `data_dir`, else RF_EVAL_DATA, else None."""
    value = (metadata or {}).get(DATA_OPTION) or os.environ.get(DATA_ENV)
    return Path(str(value)).expanduser() if value else None


def local_copy(name: str, metadata: dict[str, Any] | None) -> Path | None:
    """The local copy of source `name`: the file its option names, else the data folder's (checked against
    the folder's fetch manifest, `check_against_manifest`), else None."""
    source = SOURCES[name]
    given = (metadata or {}).get(source.option) if source.option else None
    if given:
        return Path(str(given)).expanduser()
    folder = data_dir(metadata)
    if folder is not None and (folder / source.path).exists():
        check_against_manifest(folder, name)
        return folder / source.path
    return None


def source_sha256(path: Path) -> str:
    """A file's sha256 (what `sha256sum` prints); a folder's over its files' relative paths and sha256s."""
    from rf_eval.hashing import file_sha256, named_files_sha256

    if path.is_file():
        return file_sha256(path)
    return named_files_sha256(sorted(p for p in path.rglob("*") if p.is_file()), root=path)


_checked: dict[tuple[str, str], tuple[int, str]] = {}  # (folder, source) -> (files' stamp, sha256 found)


def check_against_manifest(folder: Path, name: str) -> None:
    """Refuse a data-folder piece whose sha256 is not the one `rf-eval fetch-data` recorded in the folder's
    manifest (a file edited or replaced since: the run would score data that is not what was fetched). A
    folder without a manifest, or a piece it does not list, is the user's own and is read as it is. Each
    piece is hashed once per process, and again only when it or the manifest changes (mtime, size)."""
    from rf_eval.tasks.data_files import read_json

    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return
    recorded = (read_json(manifest_path, MANIFEST).get("sources") or {}).get(name) or {}
    want = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not want:
        return
    piece = folder / SOURCES[name].path
    files = [piece] if piece.is_file() else sorted(p for p in piece.rglob("*") if p.is_file())
    key = (str(folder.resolve()), name)
    stamp = hash((manifest_path.stat().st_mtime_ns, *((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)))
    if key in _checked and _checked[key][0] == stamp:
        found = _checked[key][1]
    else:
        found = source_sha256(folder / SOURCES[name].path)
        _checked[key] = (stamp, found)
    if found != want:
        raise UserError(f"{folder / SOURCES[name].path}: its sha256 {found[:12]}... is not the {want[:12]}... "
                        f"that fetch-data recorded in {manifest_path} (edited or replaced since); fetch it again "
                        f"(rf-eval fetch-data ... --out {folder} --force) or restore it")


def use_nltk_data(metadata: dict[str, Any] | None) -> None:
    """Put the data folder's `nltk_data` on nltk's search path (first), when it has one."""
    found = local_copy("punkt_tab", metadata)
    if found is not None:
        import nltk

        if str(found) not in nltk.data.path:
            nltk.data.path.insert(0, str(found))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def reachable(host: str, timeout: float = 5.0) -> bool:
    """Whether https://HOST answers at all (any status), through the environment's proxies."""
    import requests

    try:
        requests.head(f"https://{host}", timeout=timeout)
    except requests.RequestException:
        return False
    return True


def available(name: str, metadata: dict[str, Any] | None, hosts: dict[str, bool] | None = None) -> bool:
    """Whether a run here gets source `name`: a local copy, nltk's own install (punkt_tab), the datasets
    cache when offline, else the network (`hosts` caches the reachability of each host)."""
    source = SOURCES[name]
    if local_copy(name, metadata) is not None:
        return True
    if name == "longbench_v2":  # the task reads a local file only
        return False
    if name == "punkt_tab" and _punkt_installed():
        return True
    if offline():
        return source.cached()
    hosts = {} if hosts is None else hosts
    if source.host not in hosts:
        hosts[source.host] = reachable(source.host)
    return hosts[source.host]


def missing_message(task: str, names: list[str], why: str) -> str:
    """One line: what `task` lacks, why, the fetch command and the local options."""
    what = " and ".join(SOURCES[n].what for n in names)
    options = [f'"{SOURCES[n].option}": "PATH"' for n in names if SOURCES[n].option]
    local = f"; or name a local copy: --metadata '{{{', '.join(options)}}}'" if options else ""
    if "punkt_tab" in names:
        local += "; nltk's punkt_tab can also be put under a folder listed in NLTK_DATA"
    verb = "is" if len(names) == 1 else "are"
    return (f"{task} needs {what}, which {verb} {why}: run `rf-eval fetch-data --tasks {task} --out DIR` where the "
            f"network is reachable, then pass --metadata '{{\"{DATA_OPTION}\": \"DIR\"}}' (or set {DATA_ENV}=DIR)"
            f"{local}")


def why_missing(names: list[str]) -> str:
    if "longbench_v2" in names:
        return "not in a local file here"
    return "not here and cannot be downloaded (" + ("HF_HUB_OFFLINE is set)" if offline() else "no network)")
