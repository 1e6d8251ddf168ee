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

Each piece is one plug-in (`rf_eval.tasks.data_sources`: which tasks need it, how to fetch it, how a data
folder's copy is checked); this module and `data_fetch`, `data_needs` read that registry and name none.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rf_eval.errors import UserError
from rf_eval.harness.lm_eval_ruler import offline
from rf_eval.tasks.data_sources import SOURCES, source
from rf_eval.tasks.data_sources.base import MANIFEST

__all__ = ["DATA_ENV", "DATA_OPTION", "MANIFEST", "SOURCES", "TaskDataMissing", "available", "data_dir",
           "local_copy", "missing_message", "offline", "reachable", "use_nltk_data", "why_missing"]

DATA_ENV = "RF_EVAL_DATA"
DATA_OPTION = "data_dir"


class TaskDataMissing(UserError):
    """A task's data is neither local nor downloadable here."""


# ---- where a piece is


def data_dir(metadata: dict[str, Any] | None) -> Path | None:
    """The data folder: metadata `data_dir`, else RF_EVAL_DATA, else None."""
    value = (metadata or {}).get(DATA_OPTION) or os.environ.get(DATA_ENV)
    return Path(str(value)).expanduser() if value else None


def local_copy(name: str, metadata: dict[str, Any] | None) -> Path | None:
    """The local copy of source `name`: the file its option names, else the data folder's (checked against
    the folder's fetch manifest, `DataSource.check`), else None."""
    piece = source(name)
    given = (metadata or {}).get(piece.option) if piece.option else None
    if given:
        return Path(str(given)).expanduser()
    folder = data_dir(metadata)
    if folder is not None and (folder / piece.path).exists():
        piece.check(folder)
        return folder / piece.path
    return None


def use_nltk_data(metadata: dict[str, Any] | None) -> None:
    """Put the data folder's `nltk_data` on nltk's search path (first), when it has one."""
    found = local_copy("punkt_tab", metadata)
    if found is not None:
        import nltk

        if str(found) not in nltk.data.path:
            nltk.data.path.insert(0, str(found))


def reachable(host: str, timeout: float = 5.0) -> bool:
    """Whether https://HOST answers at all (any status), through the environment's proxies."""
    import requests

    try:
        requests.head(f"https://{host}", timeout=timeout)
    except requests.RequestException:
        return False
    return True


def available(name: str, metadata: dict[str, Any] | None, hosts: dict[str, bool] | None = None) -> bool:
    """Whether a run here gets source `name`: a local copy, its library's own install (nltk's punkt_tab), the
    datasets cache when offline, else the network (`hosts` caches the reachability of each host)."""
    piece = source(name)
    if local_copy(name, metadata) is not None:
        return True
    if piece.local_only:  # the task reads a local file only
        return False
    if piece.installed():
        return True
    if offline():
        return piece.cached()
    hosts = {} if hosts is None else hosts
    if piece.host not in hosts:
        hosts[piece.host] = reachable(piece.host)
    return hosts[piece.host]


def missing_message(task: str, names: list[str], why: str) -> str:
    """One line: what `task` lacks, why, the fetch command and the local options."""
    pieces = [SOURCES[n] for n in names]
    what = " and ".join(p.what for p in pieces)
    options = [f'"{p.option}": "PATH"' for p in pieces if p.option]
    local = f"; or name a local copy: --metadata '{{{', '.join(options)}}}'" if options else ""
    local += "".join(f"; {p.hint}" for p in pieces if p.hint)
    verb = "is" if len(names) == 1 else "are"
    return (f"{task} needs {what}, which {verb} {why}: run `rf-eval fetch-data --tasks {task} --out DIR` where the "
            f"network is reachable, then pass --metadata '{{\"{DATA_OPTION}\": \"DIR\"}}' (or set {DATA_ENV}=DIR)"
            f"{local}")


def why_missing(names: list[str]) -> str:
    """Why the sources `names` are missing here, for `missing_message`."""
    if any(SOURCES[n].local_only for n in names):
        return "not in a local file here"
    return "not here and cannot be downloaded (" + ("HF_HUB_OFFLINE is set)" if offline() else "no network)")
