"""A disk cache that one environment variable switches on: off unless it names a folder (`off`, `0`, `false`,
`no` or empty: off), and turned on at a default folder under the user's cache (`$XDG_CACHE_HOME`, else
`~/.cache`, then `rf-eval/<name>`) for the processes `rf-eval study` and `rf-eval demo` start, unless the
user set it (`child_env`). The lm-eval task index (`rf_eval.task_index_cache`) and the RULER samples
(`rf_eval.tasks.ruler_cache`) are such caches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

OFF = ("", "off", "0", "false", "no")


@dataclass(frozen=True)
class CacheFolder:
    env: str  #: the variable that names the folder
    name: str  #: the default folder's name under rf-eval's user cache

    def default_folder(self) -> Path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "rf-eval" / self.name

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with the cache on at the default folder, unless the user chose a folder (or switched it off)."""
        return env if self.env in env else {**env, self.env: str(self.default_folder())}

    def folder_from_env(self) -> Path | None:
        value = os.environ.get(self.env, "").strip()
        return None if value.lower() in OFF else Path(value).expanduser()
