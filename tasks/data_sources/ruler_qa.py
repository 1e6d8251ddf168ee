"""What RULER's two QA sources share (`squad`, `hotpotqa`): a JSON file lm-eval's `download_json` reads from the
URL its reader defaults to. Not a source itself (the registry skips this module)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import ClassVar

from rf_eval.harness.lm_eval_ruler import ruler_module
from rf_eval.tasks.data_sources.base import DataSource, write_text


class RulerQA(DataSource):
    """A RULER QA data set: `reader` names lm-eval's reader function (`qa_utils.read_squad`, ...)."""

    reader: ClassVar[str] = ""

    def url(self) -> str:
        """The URL lm-eval's RULER QA reader downloads (its `url` default)."""
        return inspect.signature(getattr(ruler_module("qa_utils"), self.reader)).parameters["url"].default

    def fetch(self, folder: Path) -> None:
        data = ruler_module("qa_utils").download_json(self.url())
        write_text(folder / self.path, json.dumps(data))
