"""nltk's `punkt_tab` sentence model, which RULER's essay tasks split the haystack with."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rf_eval.harness.lm_eval_ruler import ESSAY_HAYSTACK
from rf_eval.tasks.data_sources.base import DataSource


class PunktTab(DataSource):
    name = "punkt_tab"
    what = "nltk's punkt_tab sentence model"
    path = "nltk_data"
    host = "raw.githubusercontent.com"
    hint = "nltk's punkt_tab can also be put under a folder listed in NLTK_DATA"
    ruler_tasks = frozenset(ESSAY_HAYSTACK)

    def fetch(self, folder: Path) -> None:
        import nltk  # heavy: only when asked

        target = folder / self.path
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-nltk-", dir=folder))
        try:
            if not nltk.download("punkt_tab", download_dir=str(tmp), quiet=True, raise_on_error=True):
                raise OSError("nltk could not download punkt_tab")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def installed(self) -> bool:
        """Whether nltk finds punkt_tab where it looks (NLTK_DATA, its default folders)."""
        import nltk

        try:
            nltk.data.find("tokenizers/punkt_tab/english/")
        except LookupError:
            return False
        return True
