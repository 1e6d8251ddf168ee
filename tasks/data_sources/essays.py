"""The Paul Graham essays: the haystack of RULER's essay tasks (lm-eval's `get_haystack`, from the hub)."""

from __future__ import annotations

from pathlib import Path

from rf_eval.harness.lm_eval_ruler import ESSAY_HAYSTACK, ruler_module
from rf_eval.tasks.data_sources.base import DataSource, write_text


class Essays(DataSource):
    name = "essays"
    what = "the Paul Graham essays (RULER's essay haystack)"
    path = "paul_graham_essays.txt"
    option = "essay_haystack"
    host = "huggingface.co"
    ruler_tasks = frozenset(ESSAY_HAYSTACK)

    def fetch(self, folder: Path) -> None:
        words = ruler_module("prepare_niah").get_haystack(type_haystack="essay")
        # one text file that `ruler_data.essay_haystack` splits back into exactly these words
        write_text(folder / self.path, " ".join(words))

    def cached(self) -> bool:
        import datasets  # heavy: only when asked

        try:
            datasets.load_dataset("baber/paul_graham_essays", split="train")
        except Exception:  # not in the datasets cache (offline), or any hub error
            return False
        return True
