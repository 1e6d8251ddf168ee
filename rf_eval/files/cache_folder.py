"""rf-eval's cache folder (`cache_root`), and the disk caches that one environment variable switches on.

Such a cache is off unless its variable names a folder (`off`, `0`, `false`, `no` or empty: off), or is on at
`cache_root()/<name>` by default where the variable is unset (`on_by_default`); `rf-eval study` and
`rf-eval demo` turn each on there for the processes they start, unless the user set it (`child_env`). The lm-eval task index (`rf_eval.harness.task_index_cache`) and the RULER samples
(`rf_eval.tasks.ruler_cache`) are such caches; the demo's model and maps live under `cache_root()` too."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

OFF = ("", "off", "0", "false", "no")


def cache_root() -> Path:
    """rf-eval's cache folder: $RF_EVAL_CACHE, else $XDG_CACHE_HOME/rf-eval, else ~/.cache/rf-eval."""
    if os.environ.get("RF_EVAL_CACHE"):
        return Path(os.environ["RF_EVAL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "rf-eval"


@dataclass(frozen=True)
class CacheFolder:
    env: str  #: the variable that names the folder
    name: str  #: the default folder's name under `cache_root()`
    on_by_default: bool = False  #: with the variable unset: at the default folder, not off

    def default_folder(self) -> Path:
        return cache_root() / self.name

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with the cache on at the default folder, unless the user chose a folder (or switched it off)."""
        return env if self.env in env else {**env, self.env: str(self.default_folder())}

    def folder_from_env(self) -> Path | None:
        if self.env not in os.environ and self.on_by_default:
            return self.default_folder()
        value = os.environ.get(self.env, "").strip()
        return None if value.lower() in OFF else Path(value).expanduser()
