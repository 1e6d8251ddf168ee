"""The LongBench v2 items, which `longbench_v2_cot` reads from a local file only."""

from __future__ import annotations

import json
from pathlib import Path

from rf_eval.tasks.data_sources.base import DataSource, write_text

LONGBENCH_DATASET = "THUDM/LongBench-v2"  # the dataset of the LongBench v2 paper, one `train` split


class LongBenchV2(DataSource):
    name = "longbench_v2"
    what = "the LongBench v2 dataset"
    path = "longbench_v2.json"
    option = "data"
    host = "huggingface.co"
    local_only = True
    task_classes = ("LongBenchCoTTask",)

    def fetch(self, folder: Path) -> None:
        import datasets  # heavy: only when asked

        items = datasets.load_dataset(LONGBENCH_DATASET, split="train").to_list()
        write_text(folder / self.path, json.dumps(items, ensure_ascii=False))
